//! Values written in parts: a chunk streamed out as it is encoded, its parts written at their
//! offsets (in any order, on any IO thread) and published under its key, whole, once every
//! byte has arrived. Readers never see a value in the making.

use std::collections::HashMap;
use std::sync::Mutex;

/// Progress of the values a store is building in parts.
#[derive(Debug, Default)]
pub struct PartTracker {
    values: Mutex<HashMap<String, Building>>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Building {
    written: u64,
    total: Option<u64>,
}

/// What a finished part means for its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartOutcome {
    /// More parts are due.
    Pending,
    /// Every byte is written: publish the value, `total` bytes long.
    Complete {
        /// The value's length.
        total: u64,
    },
}

impl PartTracker {
    /// Records that `len` bytes of `key` were written, and its total length when this part
    /// is the last one issued. Returns whether the value is complete (the caller publishes
    /// it; the key is forgotten here).
    pub fn written(&self, key: &str, len: u64, total: Option<u64>) -> PartOutcome {
        let Ok(mut values) = self.values.lock() else {
            return PartOutcome::Pending;
        };
        let b = values.entry(key.to_string()).or_default();
        b.written += len;
        if total.is_some() {
            b.total = total;
        }
        match b.total {
            Some(t) if b.written >= t => {
                values.remove(key);
                PartOutcome::Complete { total: t }
            }
            _ => PartOutcome::Pending,
        }
    }

    /// Forgets every value in the making and returns their keys (to remove what they left).
    pub fn abandon_all(&self) -> Vec<String> {
        match self.values.lock() {
            Ok(mut values) => values.drain().map(|(k, _)| k).collect(),
            Err(_) => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completes_when_every_byte_has_arrived_in_any_order() {
        let t = PartTracker::default();
        // The last part (carrying the total) finishes first.
        assert_eq!(t.written("k", 4, Some(10)), PartOutcome::Pending);
        assert_eq!(t.written("k", 3, None), PartOutcome::Pending);
        assert_eq!(t.written("k", 3, None), PartOutcome::Complete { total: 10 });
        assert!(t.abandon_all().is_empty());
        // Without the total nothing completes.
        assert_eq!(t.written("j", 5, None), PartOutcome::Pending);
        assert_eq!(t.abandon_all(), vec!["j".to_string()]);
    }
}
