//! Entry points for fuzzing what the engine takes from outside: plan JSON with its
//! parameters, Zarr v2 and v3 array metadata, chunk bytes for every codec chain the engine
//! decodes (its own zstd and raw paths, blosc, gzip, sharding with its index), and object
//! storage URLs. Each takes arbitrary bytes and returns; an error is a fine answer, while a
//! panic, a hang or an allocation far beyond the input is a failure that the harnesses
//! report (`engine/tests/fuzz.rs`, `make fuzz`).

use std::collections::BTreeMap;
use std::sync::OnceLock;

use crate::array::{Buffer, DType};
use crate::plan::Plan;
use crate::read::{read_region, read_windows};
use crate::store::memory::MemoryStore;
use crate::zarr::{ArraySpec, Codec, ZarrArray};

/// A fuzz target: a name and the function that takes one input.
pub type Target = (&'static str, fn(&[u8]));

/// Every target, by name (the corpus directory of each is `engine/fuzz/corpus/NAME`).
pub const TARGETS: &[Target] = &[
    ("plan", plan),
    ("metadata", metadata),
    ("chunk", chunk),
    ("url", url),
];

/// The most bytes a target reads an array's region into: declared shapes beyond it are
/// opened and checked, not read whole.
const READ_LIMIT: u64 = 16 << 20;

/// Parses `data` as a plan's JSON, as `chunkfuse run` does, without parameters and with a
/// few (unknown ones are refused, known ones substituted).
pub fn plan(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let _ = Plan::from_json(&text, &BTreeMap::new());
    let params: BTreeMap<String, String> = [
        ("source", "memory://fuzz-src"),
        ("target", "memory://fuzz-dst"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let _ = Plan::from_json(&text, &params);
}

/// Opens `data` as an array's `zarr.json` and as a v2 `.zarray` (in memory), and reads the
/// first chunk of one that opens (its fill value, no chunk being stored); then reads it as a
/// group's metadata: `zarr.json`, v2 `.zgroup`, and a v2 group's `.zattrs` and consolidated
/// `.zmetadata`, with the target-state check (the job marker) over each.
pub fn metadata(data: &[u8]) {
    for (name, key) in [
        ("fuzz-metadata-v3", "zarr.json"),
        ("fuzz-metadata-v2", ".zarray"),
    ] {
        let store = MemoryStore::named(name);
        if store.set(key, data.to_vec()).is_err() {
            continue;
        }
        if let Ok(array) = ZarrArray::open(store) {
            read_first_chunk(&array);
        }
    }
    for (name, key) in [
        ("fuzz-group-v3", "zarr.json"),
        ("fuzz-group-v2", ".zgroup"),
        ("fuzz-group-v2-attrs", ".zattrs"),
        ("fuzz-group-v2-consolidated", ".zmetadata"),
    ] {
        let store = MemoryStore::named(name);
        let zgroup = br#"{"zarr_format": 2}"#.to_vec();
        if key != ".zgroup" && key != "zarr.json" && store.set(".zgroup", zgroup).is_err() {
            continue;
        }
        if store.set(key, data.to_vec()).is_err() {
            continue;
        }
        let _ = crate::zarr::group::read_group(store.as_ref());
        let _ = crate::zarr::target::TargetState::of(store.as_ref());
    }
}

/// Reads chunk (0, ...) of `array` whole, and a window at its start (a prefix decode), when
/// its region holds at most [`READ_LIMIT`] bytes.
fn read_first_chunk(array: &ZarrArray) {
    let shape = array.shape();
    if shape.contains(&0) {
        return;
    }
    let first = vec![0u64; shape.len()];
    let region = array.grid().chunk_region(&first);
    let elem = array.dtype().size() as u64;
    let bytes = region
        .shape
        .iter()
        .try_fold(elem, |acc, &n| acc.checked_mul(n))
        .filter(|&b| b <= READ_LIMIT);
    let Some(bytes) = bytes else { return };
    let mut out = vec![0u8; bytes as usize];
    let _ = read_region(array, &region, &mut out, 1);
    let head: Vec<u64> = region.shape.iter().map(|&n| n.div_ceil(2)).collect();
    let len = head.iter().product::<u64>() * elem;
    let mut out = vec![0u8; len as usize];
    let _ = read_windows(array, &[first], &head, &mut out, 1);
}

/// The arrays `chunk` decodes into: a codec chain, dtype and layout each.
fn fixtures() -> &'static [ZarrArray] {
    static FIXTURES: OnceLock<Vec<ZarrArray>> = OnceLock::new();
    FIXTURES.get_or_init(|| {
        let blosc = |cname: &str, shuffle: &str| Codec::Blosc {
            cname: cname.to_string(),
            clevel: 5,
            shuffle: shuffle.to_string(),
        };
        let specs = [
            (DType::F32, Codec::Zstd { level: 3 }, 3, None),
            (DType::F32, Codec::Zstd { level: 3 }, 2, None),
            (DType::I16, Codec::None, 3, None),
            (DType::F64, blosc("lz4", "shuffle"), 3, None),
            (DType::U8, blosc("zstd", "bitshuffle"), 2, None),
            (DType::F32, Codec::Gzip { level: 5 }, 3, None),
            (DType::F32, Codec::Zstd { level: 3 }, 3, Some(vec![16, 16])),
            (DType::I16, Codec::None, 3, Some(vec![16, 16])),
        ];
        specs
            .into_iter()
            .enumerate()
            .filter_map(|(i, (dtype, codec, zarr_format, shards))| {
                let store = MemoryStore::named(&format!("fuzz-chunk-{i}"));
                let spec = ArraySpec {
                    shape: vec![32, 24],
                    dtype,
                    chunks: vec![8, 8],
                    shards,
                    codec,
                    zarr_format,
                    fill: None,
                    overwrite: true,
                    existing: false,
                    region: None,
                };
                ZarrArray::create(store, &spec).ok()
            })
            .collect()
    })
}

/// The first stored chunk's key of `array` (its first shard's, when sharded).
fn first_key(array: &ZarrArray) -> String {
    array.chunk_key(&vec![0; array.shape().len()])
}

/// Decodes `data[1..]` as the first chunk (or shard) of fixture `data[0]` (modulo their
/// count): the whole chunk, and a window at its start.
pub fn chunk(data: &[u8]) {
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    let arrays = fixtures();
    let Some(array) = arrays.get(which as usize % arrays.len().max(1)) else {
        return;
    };
    if array.store().set(&first_key(array), bytes.to_vec()).is_ok() {
        read_first_chunk(array);
    }
}

/// A valid first chunk of every fixture, encoded by the engine: seeds for `chunk`.
pub fn chunk_seeds() -> Vec<Vec<u8>> {
    let mut seeds = Vec::new();
    for (i, array) in fixtures().iter().enumerate() {
        let first = vec![0u64; array.shape().len()];
        let n = array.grid().chunk_region(&first).len() as usize;
        let values: Vec<u8> = (0..n * array.dtype().size())
            .map(|b| (b % 7 * 37) as u8)
            .collect();
        let Ok(buf) = Buffer::from_bytes(array.dtype(), values) else {
            continue;
        };
        if let Ok(Some(bytes)) = array.encode_chunk(&first, &buf) {
            let mut seed = vec![i as u8];
            seed.extend_from_slice(&bytes);
            seeds.push(seed);
        }
    }
    seeds
}

/// The metadata documents of every fixture (`zarr.json`, or `.zarray`): seeds for
/// `metadata`.
pub fn metadata_seeds() -> Vec<Vec<u8>> {
    fixtures()
        .iter()
        .filter_map(|array| {
            ["zarr.json", ".zarray"]
                .iter()
                .find_map(|key| array.store().get(key).ok().flatten())
                .map(|v| v.to_vec())
        })
        .collect()
}

/// Opens `data` as an object storage URL (`s3://`, `gs://`, `http(s)://`): parsing and
/// client set-up only, no request.
pub fn url(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let _ = crate::store::writes_in_parts(&text);
    if let Some((scheme, _)) = text.split_once("://") {
        if !matches!(scheme, "file" | "memory") && !scheme.is_empty() {
            let _ = crate::store::object::ObjectBackend::open(&text);
        }
    }
}
