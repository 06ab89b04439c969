use super::*;
use crate::array::{Buffer, Region};
use crate::store::fs::FsStore;

fn spec(shards: Option<Vec<u64>>, zarr_format: u8) -> ArraySpec {
    ArraySpec {
        shape: vec![5, 7],
        dtype: DType::F32,
        chunks: vec![2, 3],
        shards,
        codec: Codec::default(),
        zarr_format,
        fill: Some(1.5f32.to_ne_bytes().to_vec()),
        overwrite: true,
        existing: false,
        region: None,
    }
}

fn round_trip(s: ArraySpec) {
    let shape = s.shape.clone();
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(FsStore::new(dir.path(), 2).unwrap());
    let arr = ZarrArray::create(store.clone(), &s).unwrap();
    let grid = arr.grid().clone();
    for idx in grid.chunk_indices() {
        let r = grid.chunk_region(&idx);
        let mut b = Buffer::zeros(DType::F32, r.len() as usize);
        for (k, v) in b.as_slice_mut::<f32>().unwrap().iter_mut().enumerate() {
            *v = (r.start[0] * 100 + r.start[1]) as f32 + k as f32 * 0.25;
        }
        if let Some(bytes) = arr.encode_chunk(&idx, &b).unwrap() {
            store.set(&arr.chunk_key(&idx), bytes).unwrap();
        }
    }
    let reopened = ZarrArray::open(store.clone()).unwrap();
    assert_eq!(reopened.shape(), shape);
    assert_eq!(reopened.fill_bytes(), &1.5f32.to_ne_bytes());
    for idx in grid.chunk_indices() {
        let r = grid.chunk_region(&idx);
        let bytes = store.get(&reopened.chunk_key(&idx)).unwrap();
        let b = reopened
            .decode_chunk(&idx, bytes.map(crate::store::Value::Owned))
            .unwrap();
        let v = b.as_slice::<f32>().unwrap();
        assert_eq!(v.len() as u64, r.len());
        assert_eq!(
            v[v.len() - 1],
            (r.start[0] * 100 + r.start[1]) as f32 + (v.len() - 1) as f32 * 0.25
        );
    }
}

#[test]
fn v3_round_trip_with_edge_chunks() {
    round_trip(spec(None, 3));
}

#[test]
fn v3_sharded_round_trip() {
    let mut s = spec(Some(vec![4, 6]), 3);
    s.shape = vec![8, 12];
    round_trip(s);
}

#[test]
fn v2_round_trip() {
    round_trip(spec(None, 2));
}

#[test]
fn missing_chunk_is_fill_value_and_fill_chunks_are_not_stored() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(FsStore::new(dir.path(), 1).unwrap());
    let arr = ZarrArray::create(store, &spec(None, 3)).unwrap();
    let b = arr.decode_chunk(&[2, 2], None).unwrap();
    assert_eq!(b.as_slice::<f32>().unwrap(), &[1.5]);
    assert_eq!(arr.encode_chunk(&[2, 2], &b).unwrap(), None);
}

#[test]
fn a_guarded_intermediate_stores_fill_chunks_and_a_missing_one_is_an_error() {
    for shards in [None, Some(vec![4, 6])] {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(FsStore::new(dir.path(), 1).unwrap());
        let arr = ZarrArray::create(store, &spec(shards.clone(), 3))
            .unwrap()
            .with_removal_guard();
        // A chunk of fill values (an argmax of zeros, say) is stored, so reading it back
        // never looks like a removed chunk.
        let n = arr.grid().chunk_region(&[0, 0]).len() as usize;
        let b = Buffer::filled(DType::F32, n, &1.5f32.to_ne_bytes());
        assert!(
            arr.encode_chunk(&[0, 0], &b).unwrap().is_some(),
            "{shards:?}"
        );
        assert!(
            arr.encode_chunk_owned(&[0, 0], b).unwrap().is_some(),
            "{shards:?}"
        );
        let e = arr.decode_read(&[1, 1], None).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Store, "{shards:?}");
        assert!(e.to_string().contains("is gone"), "{e}");
    }
}

#[test]
fn corrupt_chunk_names_key_and_store() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(FsStore::new(dir.path(), 1).unwrap());
    let arr = ZarrArray::create(store, &spec(None, 3)).unwrap();
    let e = arr
        .decode_chunk(&[0, 1], Some(crate::store::Value::Owned(vec![1, 2, 3, 4])))
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Corrupt);
    assert_eq!(e.context.chunk_key.as_deref(), Some("c/0/1"));
    assert!(e.context.store.is_some());
}

#[test]
fn a_sparse_array_of_more_chunks_than_memory_holds_opens_and_reads() {
    // 2^53 + 1 rows of one chunk each: listing their boundaries would take 72 PB.
    let store = crate::store::memory::MemoryStore::named("sparse-huge");
    let doc = br#"{"zarr_format":2,"shape":[9007199254740993,1000],"chunks":[1,1000],
        "dtype":"<f4","compressor":null,"fill_value":"NaN","order":"C","filters":null}"#;
    store.set(".zarray", doc.to_vec()).unwrap();
    let arr = ZarrArray::open(store).unwrap();
    assert_eq!(arr.grid().shape()[0], 9007199254740993);
    let region = Region {
        start: vec![9007199254740990, 10],
        shape: vec![3, 4],
    };
    let mut out = vec![0u8; 12 * 4];
    crate::read::read_region(&arr, &region, &mut out, 1).unwrap();
    assert!(bytemuck::cast_slice::<u8, f32>(&out)
        .iter()
        .all(|v| v.is_nan()));
}

#[test]
fn a_blosc_header_declaring_more_than_the_chunk_is_corrupt_not_allocated() {
    let store = crate::store::memory::MemoryStore::named("blosc-header");
    let mut s = spec(None, 3);
    s.codec = Codec::Blosc {
        cname: "lz4".into(),
        clevel: 5,
        shuffle: "shuffle".into(),
    };
    let arr = ZarrArray::create(store, &s).unwrap();
    // A blosc header (version 2, flags, typesize 4) declaring 2 GB of decoded bytes.
    let mut bytes = vec![2u8, 1, 1, 4];
    bytes.extend_from_slice(&0x7A00_0000u32.to_le_bytes());
    bytes.extend_from_slice(&[0x40, 0, 0, 0, 40, 0, 0, 0]);
    bytes.extend_from_slice(&[0u8; 24]);
    let e = arr
        .decode_chunk(&[0, 1], Some(crate::store::Value::Owned(bytes)))
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Corrupt);
    assert!(e.to_string().contains("blosc header declares"), "{e}");
}

#[test]
fn existing_arrays_are_opened_with_their_own_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(FsStore::new(dir.path(), 2).unwrap());
    let mut made = spec(None, 3);
    made.codec = Codec::Gzip { level: 1 };
    ZarrArray::create(store.clone(), &made).unwrap();

    // Asked to write into it with another codec: the array keeps its gzip and fill value.
    let mut into = spec(None, 3);
    into.existing = true;
    into.overwrite = false;
    let arr = ZarrArray::create(store.clone(), &into).unwrap();
    assert!(arr.info().codecs.iter().any(|c| c.contains("gzip")));
    assert_eq!(arr.fill_bytes(), &1.5f32.to_ne_bytes());

    // A different shape, dtype or chunking is refused, naming the store.
    for change in [
        |s: &mut ArraySpec| s.shape = vec![5, 8],
        |s: &mut ArraySpec| s.dtype = DType::F64,
        |s: &mut ArraySpec| s.chunks = vec![5, 7],
    ] {
        let mut wrong = into.clone();
        change(&mut wrong);
        let err = ZarrArray::create(store.clone(), &wrong).unwrap_err();
        assert_eq!(err.kind, ErrorKind::Plan, "{err}");
        assert!(err.to_string().contains("existing array"), "{err}");
    }
}

/// The value the raw-shard test stores at (row, column).
fn value_at(i: u64, j: u64) -> f32 {
    (i * 100 + j) as f32 + 0.5
}

#[test]
fn raw_shards_read_back_whole_and_by_inner_chunk() {
    // 7 x 11 in (2, 3) chunks and (4, 6) shards: edge shards hold inner chunks that reach
    // past the array and (bottom right) inner chunks wholly outside it.
    let mut s = spec(Some(vec![4, 6]), 3);
    s.shape = vec![7, 11];
    s.codec = Codec::None;
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(FsStore::new(dir.path(), 2).unwrap());
    let arr = ZarrArray::create(store.clone(), &s).unwrap();
    assert!(arr.raw_shard_layout().is_some());
    let fill = |region: &Region, dst: &mut [u8]| {
        let vals: Vec<f32> = (0..region.shape[0])
            .flat_map(|a| {
                (0..region.shape[1])
                    .map(move |b| value_at(region.start[0] + a, region.start[1] + b))
            })
            .collect();
        dst.copy_from_slice(bytemuck::cast_slice(&vals));
    };
    for shard in arr.grid().chunk_indices() {
        let bytes = arr.encode_raw_shard(&shard, fill).unwrap();
        store.set(&arr.chunk_key(&shard), bytes).unwrap();
    }
    let check = |b: &Buffer, r: &Region| {
        let v = b.as_slice::<f32>().unwrap();
        assert_eq!(v.len() as u64, r.len());
        for (k, x) in v.iter().enumerate() {
            let (a, c) = (k as u64 / r.shape[1], k as u64 % r.shape[1]);
            assert_eq!(*x, value_at(r.start[0] + a, r.start[1] + c));
        }
    };
    // Whole shards, decoded by zarrs's sharding codec.
    let reopened = ZarrArray::open(store.clone()).unwrap();
    for shard in reopened.grid().chunk_indices() {
        let bytes = store.get(&reopened.chunk_key(&shard)).unwrap();
        let b = reopened
            .decode_chunk(&shard, bytes.map(crate::store::Value::Owned))
            .unwrap();
        check(&b, &reopened.grid().chunk_region(&shard));
    }
    // Inner chunks one by one, by ranged reads.
    let inner = ZarrArray::open(store.clone()).unwrap().with_inner_reads();
    assert_eq!(inner.read_grid().chunk_shape(), vec![2, 3]);
    for idx in inner.read_grid().chunk_indices() {
        let req = inner.read_request(&idx).unwrap();
        assert!(req.range.is_some());
        let value = store.get_many(vec![req]).unwrap().pop().flatten();
        let region = inner.read_grid().chunk_region(&idx);
        if let Some(v) = &value {
            let interior = region.shape == vec![2, 3];
            assert_eq!(inner.raw_values(&idx, v).is_some(), interior);
        }
        check(&inner.decode_read(&idx, value).unwrap(), &region);
    }
    // A shard that was never written reads as the fill value.
    store.erase(&inner.chunk_key(&[0, 0])).unwrap();
    let fresh = ZarrArray::open(store.clone()).unwrap().with_inner_reads();
    let req = fresh.read_request(&[0, 0]).unwrap();
    let value = store.get_many(vec![req]).unwrap().pop().flatten();
    let b = fresh.decode_read(&[0, 0], value).unwrap();
    assert!(b.as_slice::<f32>().unwrap().iter().all(|x| *x == 1.5));
}

/// Chunks encoded as streams, rows fed a few at a time, decode to the values fed, edge chunks
/// (padded on two axes) included, and match what one-shot encoding stores.
#[test]
fn streamed_chunks_decode_to_their_rows() {
    for codec in [Codec::Zstd { level: 3 }, Codec::None] {
        let s = ArraySpec {
            shape: vec![9, 7, 5],
            dtype: DType::F32,
            chunks: vec![4, 3, 2],
            shards: None,
            codec: codec.clone(),
            zarr_format: 3,
            fill: Some(1.5f32.to_ne_bytes().to_vec()),
            overwrite: true,
            existing: false,
            region: None,
        };
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(FsStore::new(dir.path(), 2).unwrap());
        let arr = ZarrArray::create(store.clone(), &s).unwrap();
        assert!(arr.streams_chunks());
        let grid = arr.grid().clone();
        for idx in grid.chunk_indices() {
            let r = grid.chunk_region(&idx);
            let values: Vec<f32> = (0..r.len()).map(|k| k as f32 * 0.5 - 3.0).collect();
            let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
            let row = bytes.len() / r.shape[0] as usize;
            let mut stream = arr.chunk_stream(&idx).unwrap();
            // Rows one at a time, then the rest together.
            stream.feed_rows(&bytes[..row]).unwrap();
            assert!(stream.feed_rows(&bytes[..row / 2 + 1]).is_err());
            stream.feed_rows(&bytes[row..]).unwrap();
            assert_eq!(stream.rows_fed(), r.shape[0]);
            let mut encoded = Vec::new();
            if let Some((offset, part)) = stream.take_part(1) {
                assert_eq!(offset, 0);
                encoded.extend(part);
            }
            let (offset, last, total) = stream.finish().unwrap();
            assert_eq!(offset as usize, encoded.len());
            encoded.extend(last);
            assert_eq!(encoded.len() as u64, total);
            let decoded = arr
                .decode_chunk(&idx, Some(crate::store::Value::Owned(encoded.clone())))
                .unwrap();
            assert_eq!(decoded.as_slice::<f32>().unwrap(), &values[..], "{idx:?}");
            // The same stored values as one-shot encoding.
            let mut b = Buffer::zeros(DType::F32, r.len() as usize);
            b.as_slice_mut::<f32>().unwrap().copy_from_slice(&values);
            let whole = arr.encode_chunk(&idx, &b).unwrap().unwrap();
            let again = arr
                .decode_chunk(&idx, Some(crate::store::Value::Owned(whole.clone())))
                .unwrap();
            assert_eq!(again.as_slice::<f32>().unwrap(), &values[..]);
            if codec == Codec::None {
                assert_eq!(encoded, whole, "{idx:?}");
            }
        }
        // A chunk ended early is an error.
        let stream = arr.chunk_stream(&[0, 0, 0]).unwrap();
        assert!(stream.finish().is_err());
    }
}

#[test]
fn chunks_encoded_on_several_threads_decode_exactly() {
    // 4 MiB of float32: large enough for two zstd worker threads.
    let s = ArraySpec {
        shape: vec![1024, 1024],
        chunks: vec![1024, 1024],
        fill: None,
        ..spec(None, 3)
    };
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(FsStore::new(dir.path(), 2).unwrap());
    let arr = ZarrArray::create(store, &s).unwrap();
    let mut b = Buffer::zeros(DType::F32, 1024 * 1024);
    for (k, v) in b.as_slice_mut::<f32>().unwrap().iter_mut().enumerate() {
        *v = ((k * 7919) % 10007) as f32 * 0.5 + (k / 1024) as f32;
    }
    let one = arr.encode_chunk_on(&[0, 0], &b, 1).unwrap().unwrap();
    let two = arr.encode_chunk_on(&[0, 0], &b, 2).unwrap().unwrap();
    // Different frames (zstd splits the input into jobs), the same values.
    assert_ne!(one, two);
    for bytes in [one, two] {
        let back = arr
            .decode_chunk(&[0, 0], Some(crate::store::Value::Owned(bytes)))
            .unwrap();
        assert_eq!(
            back.as_slice::<f32>().unwrap(),
            b.as_slice::<f32>().unwrap()
        );
    }
}

#[test]
fn chunk_heads_decode_straight_into_place() {
    let s = ArraySpec {
        shape: vec![64, 300],
        chunks: vec![64, 256],
        ..spec(None, 3)
    };
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(FsStore::new(dir.path(), 2).unwrap());
    let arr = ZarrArray::create(store, &s).unwrap();
    for idx in [[0u64, 0], [0, 1]] {
        let region = arr.grid().chunk_region(&idx);
        let n = region.len() as usize;
        let mut b = Buffer::zeros(DType::F32, n);
        for (k, v) in b.as_slice_mut::<f32>().unwrap().iter_mut().enumerate() {
            *v = ((k * 7919) % 10007) as f32 * 0.5 + idx[1] as f32;
        }
        let bytes = arr.encode_chunk(&idx, &b).unwrap().unwrap();
        let whole = n * 4;
        // The whole chunk, a short head (decoded alone), a head too long to stop early.
        for len in [whole, whole / 8, whole * 19 / 20] {
            let mut dst = vec![0u8; len];
            let value = crate::store::Value::Owned(bytes.clone());
            let decoded = arr
                .decode_chunk_head_into(&idx, Some(value), &mut dst)
                .unwrap();
            assert_eq!(dst, b.bytes()[..len], "chunk {idx:?}, {len} bytes");
            // Only a head of a chunk inside the array, short enough, is decoded alone.
            let alone = idx == [0, 0] && len == whole / 8;
            assert_eq!(decoded, if alone { len } else { whole });
        }
        // A missing chunk: its head is the fill value.
        let mut dst = vec![0u8; 16];
        arr.decode_chunk_head_into(&idx, None, &mut dst).unwrap();
        assert_eq!(dst, 1.5f32.to_ne_bytes().repeat(4));
    }
}

#[test]
fn a_data_type_zarrs_does_not_know_is_unsupported_not_corrupt() {
    // Fixed-width byte strings: valid Zarr v2 that zarrs has no data type for.
    let store = crate::store::memory::MemoryStore::named("bytes-s4");
    let doc = br#"{"zarr_format":2,"shape":[6],"chunks":[2],"dtype":"|S4",
        "compressor":null,"fill_value":"","order":"C","filters":null}"#;
    store.set(".zarray", doc.to_vec()).unwrap();
    let e = ZarrArray::open(store.clone()).unwrap_err();
    assert_eq!(e.kind, crate::error::ErrorKind::Unsupported, "{e}");
    assert!(e.to_string().contains("|S4"), "{e}");
    // Metadata that is not valid stays corrupt.
    let doc = br#"{"zarr_format":2,"shape":[6],"chunks":[2],"dtype":"<f4",
        "compressor":null,"fill_value":"x","order":"C","filters":null}"#;
    store.set(".zarray", doc.to_vec()).unwrap();
    let e = ZarrArray::open(store.clone()).unwrap_err();
    assert_eq!(e.kind, crate::error::ErrorKind::Corrupt, "{e}");
    // A numcodecs filter zarrs has no codec for.
    let doc = br#"{"zarr_format":2,"shape":[6],"chunks":[2],"dtype":"<i8",
        "compressor":null,"fill_value":0,"order":"C",
        "filters":[{"id":"delta","dtype":"<i8"}]}"#;
    store.set(".zarray", doc.to_vec()).unwrap();
    let e = ZarrArray::open(store).unwrap_err();
    assert_eq!(e.kind, crate::error::ErrorKind::Unsupported, "{e}");
    assert!(e.to_string().contains("delta"), "{e}");
}

#[test]
fn v2_complex_and_unicode_arrays_without_a_fill_value_open() {
    // zarr-python writes `fill_value: null` for them; zarrs refuses null for these types.
    let store = crate::store::memory::MemoryStore::named("complex-null-fill");
    let doc = br#"{"zarr_format":2,"shape":[4],"chunks":[2],"dtype":"<c8",
        "compressor":null,"fill_value":null,"order":"C","filters":null}"#;
    store.set(".zarray", doc.to_vec()).unwrap();
    let arr = ZarrArray::open(store.clone()).unwrap();
    assert_eq!(arr.dtype(), DType::C64);
    assert!(arr.fill_bytes().iter().all(|&b| b == 0));
    // Every chunk is stored (no fill value to leave one out for), and v2 copies keep null.
    assert!(arr.attrs().null_v2_fill);
    let ones = Buffer::from_bytes(DType::C64, vec![0u8; 16]).unwrap();
    assert!(arr.encode_chunk(&[0], &ones).unwrap().is_some());
}

#[test]
fn opening_a_group_as_an_array_says_so_naming_the_store() {
    for (key, doc) in [
        (".zgroup", r#"{"zarr_format":2}"#),
        ("zarr.json", r#"{"zarr_format":3,"node_type":"group"}"#),
    ] {
        let store = crate::store::memory::MemoryStore::named(&format!("a-group{key}"));
        store.set(key, doc.as_bytes().to_vec()).unwrap();
        let e = ZarrArray::open(store.clone()).unwrap_err().to_string();
        assert!(e.contains("this is a Zarr group, not an array"), "{e}");
        assert!(e.contains(store.url()), "{e}");
    }
}
