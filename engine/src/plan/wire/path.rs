//! Errors that keep their JSON path through the plan's tagged objects.
//!
//! serde buffers an object before choosing its variant by tag, which loses the path
//! `serde_path_to_error` tracks. The tagged types therefore deserialize their variant from the
//! buffered object with a tracker of their own, and carry the inner path inside the error
//! message (after [`MARK`]) for the caller to join to its own.

use serde::de::{self, DeserializeOwned};
use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// Separates an inner JSON path from the message in a nested error.
const MARK: char = '\u{1}';

/// An error message at `path` (relative to the object being read).
pub fn at<E: de::Error>(path: &str, message: impl std::fmt::Display) -> E {
    E::custom(format!("{MARK}{path}{MARK}{message}"))
}

/// Splits a message made by [`at`] into its path and message; `None` for a plain message.
fn split(message: &str) -> Option<(&str, &str)> {
    let rest = message.strip_prefix(MARK)?;
    rest.split_once(MARK)
}

/// `outer` and `inner` joined as one JSON path (`ops[0]` + `expr.op` = `ops[0].expr.op`).
fn join(outer: &str, inner: &str) -> String {
    match (outer, inner) {
        ("" | ".", i) => i.to_string(),
        (o, "" | ".") => o.to_string(),
        (o, i) if i.starts_with('[') => format!("{o}{i}"),
        (o, i) => format!("{o}.{i}"),
    }
}

/// A path and message from a `serde_path_to_error` error, nested paths joined.
fn located<E: std::fmt::Display>(err: serde_path_to_error::Error<E>) -> (String, String) {
    let outer = err.path().to_string();
    let message = err.into_inner().to_string();
    match split(&message) {
        Some((inner, m)) => (join(&outer, inner), m.to_string()),
        None => (join(&outer, ""), message),
    }
}

/// Removes the string field `tag` from `map`.
pub fn take_tag<E: de::Error>(
    map: &mut Map<String, Value>,
    tag: &'static str,
) -> Result<String, E> {
    match map.remove(tag) {
        None | Some(Value::Null) => Err(E::missing_field(tag)),
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(at(tag, format!("expected a string, got {other}"))),
    }
}

/// Deserializes `T` from the fields of a tagged object, keeping the path of an error in it.
pub fn variant<T: DeserializeOwned, E: de::Error>(map: Map<String, Value>) -> Result<T, E> {
    serde_path_to_error::deserialize(Value::Object(map)).map_err(|e| {
        let (path, message) = located(e);
        at(&path, message)
    })
}

/// Deserializes `T` from a whole plan document; a failure is a plan error naming the JSON
/// path of the bad field.
pub fn document<T: DeserializeOwned>(value: &Value) -> Result<T> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let (path, message) = located(e);
        Error::plan(path, message)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joins_paths() {
        assert_eq!(join(".", "op"), "op");
        assert_eq!(join("ops[0]", "."), "ops[0]");
        assert_eq!(join("ops[0]", "expr.args[1]"), "ops[0].expr.args[1]");
        assert_eq!(join("ops[0].selection", "[2]"), "ops[0].selection[2]");
    }
}
