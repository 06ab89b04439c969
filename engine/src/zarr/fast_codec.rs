//! Chunk formats the engine encodes and decodes itself (zstd over little-endian bytes, and
//! uncompressed little-endian bytes) with per-thread contexts into pooled buffers, instead of
//! through zarrs' generic chain.

/// zstd settings of a chunk format the engine encodes itself (see `detect_fast_encode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ZstdParams {
    pub(super) level: i32,
    pub(super) checksum: bool,
}

/// The zstd settings of `bytes` + `zstd` (v3) or a C-order v2 `zstd` compressor without
/// filters: such chunks are encoded with a reused per-thread compression context into a pooled
/// buffer (a fresh context per chunk costs its tables' page faults, more than the encode).
pub(super) fn detect_fast_encode(raw: &serde_json::Value) -> Option<ZstdParams> {
    detect_fast_codec(raw)?;
    let config = if raw.get("zarr_format").and_then(|v| v.as_u64()) == Some(2) {
        raw.get("compressor")?
    } else {
        raw.get("codecs")?
            .as_array()?
            .get(1)?
            .get("configuration")?
    };
    let level = config.get("level").and_then(|l| l.as_i64()).unwrap_or(0);
    let checksum = config
        .get("checksum")
        .and_then(|c| c.as_bool())
        .unwrap_or(false);
    Some(ZstdParams {
        level: i32::try_from(level).ok()?,
        checksum,
    })
}

/// A compression context: its parameters, zstd worker threads, and the process generation
/// it was made in (a context with worker threads made before a fork is useless after it).
type EncoderKey = (ZstdParams, u32, u64);

thread_local! {
    static ZSTD_ENCODER: std::cell::RefCell<Option<(EncoderKey, zstd::bulk::Compressor<'static>)>> =
        const { std::cell::RefCell::new(None) };
}

/// Smallest input per zstd worker thread (zstd's own minimum job size is 512 KiB).
const ZSTD_MIN_JOB: usize = 1 << 20;

/// zstd-compresses `src` with `params`, reusing this thread's compression context. With
/// `threads` > 1 and an input large enough, zstd's own worker threads compress parts of the
/// one frame at once (for a lone chunk that would otherwise leave every other core idle).
pub(super) fn zstd_encode(
    src: &[u8],
    params: ZstdParams,
    threads: usize,
) -> std::result::Result<Vec<u8>, String> {
    use zstd::zstd_safe::CParameter;
    let workers = threads.min(src.len() / ZSTD_MIN_JOB).max(1);
    let workers = if workers > 1 { workers as u32 } else { 0 };
    let mut out = crate::array::pool::take(zstd::zstd_safe::compress_bound(src.len()));
    ZSTD_ENCODER.with(|cell| {
        let mut slot = cell.borrow_mut();
        let key = (params, workers, crate::fork_safe::generation());
        if slot.as_ref().map(|(k, _)| *k) != Some(key) {
            let mut c = zstd::bulk::Compressor::new(params.level).map_err(|e| e.to_string())?;
            c.set_parameter(CParameter::ChecksumFlag(params.checksum))
                .map_err(|e| e.to_string())?;
            c.set_parameter(CParameter::NbWorkers(workers))
                .map_err(|e| e.to_string())?;
            *slot = Some((key, c));
        }
        match slot.as_mut() {
            Some((_, c)) => {
                if workers > 1 {
                    let job = src.len().div_ceil(workers as usize);
                    c.set_parameter(CParameter::JobSize(job as u32))
                        .map_err(|e| e.to_string())?;
                }
                c.compress_to_buffer(src, &mut out)
                    .map_err(|e| e.to_string())
            }
            None => Err("no zstd compressor".to_string()),
        }
    })?;
    Ok(out)
}

/// Codec chains the engine decodes itself, into pooled buffers, instead of through zarrs'
/// generic chain (which allocates fresh output for every chunk).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FastCodec {
    /// Little-endian bytes compressed with zstd (v3 `bytes` + `zstd`, v2 `zstd` in C order).
    Zstd,
    /// Little-endian bytes, uncompressed (v3 `bytes` alone, v2 without compressor in C order).
    Raw,
}

pub(super) fn detect_fast_codec(raw: &serde_json::Value) -> Option<FastCodec> {
    let name = |c: &serde_json::Value| c.get("name").and_then(|n| n.as_str()).map(String::from);
    if raw.get("zarr_format").and_then(|v| v.as_u64()) == Some(2) {
        let dtype = raw.get("dtype")?.as_str()?;
        let little = dtype.starts_with('<') || dtype.starts_with('|');
        let no_filters = raw
            .get("filters")
            .is_none_or(|f| f.is_null() || f.as_array().is_some_and(|a| a.is_empty()));
        let c_order = raw.get("order").and_then(|o| o.as_str()) != Some("F");
        let fast = match raw.get("compressor")? {
            serde_json::Value::Null => FastCodec::Raw,
            c if c.get("id")?.as_str()? == "zstd" => FastCodec::Zstd,
            _ => return None,
        };
        return (little && no_filters && c_order && cfg!(target_endian = "little")).then_some(fast);
    }
    let codecs = raw.get("codecs")?.as_array()?;
    if name(codecs.first()?).as_deref() != Some("bytes") {
        return None;
    }
    let fast = match codecs.get(1).map(name) {
        None => FastCodec::Raw,
        Some(Some(n)) if n == "zstd" && codecs.len() == 2 => FastCodec::Zstd,
        _ => return None,
    };
    let endian = codecs[0]
        .get("configuration")
        .and_then(|c| c.get("endian"))
        .and_then(|e| e.as_str())
        .unwrap_or("little");
    (endian == "little" && cfg!(target_endian = "little")).then_some(fast)
}

thread_local! {
    static ZSTD: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { std::cell::RefCell::new(None) };
}

/// zstd-decompresses `src` into a pooled buffer of exactly `len` bytes.
pub(super) fn zstd_decode(src: &[u8], len: usize) -> std::result::Result<Vec<u8>, String> {
    let mut out = crate::array::pool::take(len);
    let n = with_zstd_decompressor(|d| d.decompress_to_buffer(src, &mut out));
    match n {
        Ok(n) if n == len => Ok(out),
        other => {
            crate::array::pool::give(out);
            Err(zstd_size_error(other, len))
        }
    }
}

thread_local! {
    static ZSTD_STREAM: std::cell::RefCell<Option<zstd::stream::raw::Decoder<'static>>> =
        const { std::cell::RefCell::new(None) };
}

/// zstd-decompresses only the first `dst.len()` bytes of the frame `src` into `dst`,
/// stopping there (a window near the start of a chunk costs part of its decode).
pub(super) fn zstd_decode_prefix(src: &[u8], dst: &mut [u8]) -> std::result::Result<(), String> {
    use zstd::stream::raw::{InBuffer, Operation, OutBuffer};
    ZSTD_STREAM.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(zstd::stream::raw::Decoder::new().map_err(|e| e.to_string())?);
        }
        let Some(d) = slot.as_mut() else {
            return Err("no zstd decompressor".to_string());
        };
        d.reinit().map_err(|e| e.to_string())?;
        let mut input = InBuffer::around(src);
        let mut output = OutBuffer::around(dst);
        while output.pos() < output.capacity() {
            let before = (input.pos(), output.pos());
            d.run(&mut input, &mut output).map_err(|e| e.to_string())?;
            if (input.pos(), output.pos()) == before {
                return Err(format!(
                    "zstd frame ends after {} bytes, before the {} wanted",
                    output.pos(),
                    output.capacity()
                ));
            }
        }
        Ok(())
    })
}

/// zstd-decompresses `src` into exactly `dst` (an error unless the frame fills it).
pub(super) fn zstd_decode_into(src: &[u8], dst: &mut [u8]) -> std::result::Result<(), String> {
    let len = dst.len();
    match with_zstd_decompressor(|d| d.decompress_to_buffer(src, dst)) {
        Ok(n) if n == len => Ok(()),
        other => Err(zstd_size_error(other, len)),
    }
}

fn zstd_size_error(got: std::result::Result<usize, String>, len: usize) -> String {
    match got {
        Ok(n) => format!("zstd frame holds {n} bytes, the chunk needs {len}"),
        Err(e) => e,
    }
}

/// Runs `f` with this thread's zstd decompression context.
fn with_zstd_decompressor(
    f: impl FnOnce(&mut zstd::bulk::Decompressor<'static>) -> std::io::Result<usize>,
) -> std::result::Result<usize, String> {
    ZSTD.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(zstd::bulk::Decompressor::new().map_err(|e| e.to_string())?);
        }
        match slot.as_mut() {
            Some(d) => f(d).map_err(|e| e.to_string()),
            None => Err("no zstd decompressor".to_string()),
        }
    })
}

/// Whether a chunk's outermost codec (the first decoded) is blosc: v2's `compressor`, or the
/// last of a v3 codec list `codecs`.
pub(super) fn outer_blosc(raw: &serde_json::Value, codecs: Option<&serde_json::Value>) -> bool {
    if let Some(list) = codecs.and_then(|c| c.as_array()) {
        return list
            .last()
            .and_then(|c| c.get("name"))
            .and_then(|n| n.as_str())
            == Some("blosc");
    }
    raw.get("compressor")
        .and_then(|c| c.get("id"))
        .and_then(|n| n.as_str())
        == Some("blosc")
}

/// Refuses blosc bytes whose header declares more decoded bytes than the chunk can hold
/// (`len`, plus what inner codecs add): the decoder would allocate what the header says
/// before finding the bytes corrupt.
pub(super) fn check_blosc_header(bytes: &[u8], len: usize) -> Result<(), String> {
    let Some(declared) = bytes.get(4..8) else {
        return Err(format!("{} bytes hold no blosc header", bytes.len()));
    };
    let declared = u32::from_le_bytes([declared[0], declared[1], declared[2], declared[3]]);
    // Inner codecs (a checksum) add a few bytes to what blosc compressed.
    let most = len.saturating_add(1024);
    if declared as usize > most {
        return Err(format!(
            "the blosc header declares {declared} decoded bytes, the chunk holds {len}"
        ));
    }
    Ok(())
}
