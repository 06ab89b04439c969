//! The size of the processor's last-level cache, for choices that depend on whether a
//! working set stays in cache.

use std::sync::OnceLock;

/// Bytes of the largest cache of CPU 0 that Linux reports in sysfs, once per process;
/// `None` where sysfs does not say (other systems, restricted containers).
pub fn last_level_cache_bytes() -> Option<u64> {
    static SIZE: OnceLock<Option<u64>> = OnceLock::new();
    *SIZE.get_or_init(|| {
        let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
        dir.filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("index"))
            .filter_map(|e| std::fs::read_to_string(e.path().join("size")).ok())
            .filter_map(|s| parse_cache_size(&s))
            .max()
    })
}

/// Parses sysfs cache sizes such as `32768K`, `1024K` or `8M`.
fn parse_cache_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let (digits, unit) = match t.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => t.split_at(i),
        None => (t, ""),
    };
    let n: u64 = digits.parse().ok()?;
    let scale = match unit.trim() {
        "" => 1,
        "K" | "k" => 1 << 10,
        "M" | "m" => 1 << 20,
        "G" | "g" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(scale)
}

#[cfg(test)]
mod tests {
    use super::parse_cache_size;

    #[test]
    fn parses_sysfs_sizes() {
        assert_eq!(parse_cache_size("32768K\n"), Some(32 << 20));
        assert_eq!(parse_cache_size("8M"), Some(8 << 20));
        assert_eq!(parse_cache_size("512"), Some(512));
        assert_eq!(parse_cache_size("12Q"), None);
        assert_eq!(parse_cache_size(""), None);
    }
}
