//! Reading one object of a batch: whole, or its ranges together.

use std::ops::Range;
use std::sync::Arc;

use object_store::path::Path;
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt};

use super::runtime::in_flight;

/// The requests of a batch for one object, by request index: whole reads, bounded ranges,
/// and open ranges (to the end, or the last bytes).
pub(super) type ObjectRequests = (Vec<usize>, Vec<(usize, Range<u64>)>, Vec<(usize, GetRange)>);

/// Reads of one object: whole, or these ranges (with the request index of each).
pub(super) enum ObjectReads {
    Whole(Vec<usize>),
    Ranges(Vec<(usize, Range<u64>)>, Vec<(usize, GetRange)>),
}

/// Reads everything `reqs` asks of the object at `path`, into `out` by request index.
pub(super) async fn read_object(
    store: Arc<dyn ObjectStore>,
    path: Path,
    reads: ObjectReads,
) -> std::result::Result<Vec<(usize, Option<Vec<u8>>)>, object_store::Error> {
    let permit = in_flight().acquire_owned().await;
    let missing = |idx: Vec<usize>| idx.into_iter().map(|i| (i, None)).collect();
    let result = match reads {
        ObjectReads::Whole(idx) => match store.get(&path).await {
            Ok(r) => {
                let bytes = r.bytes().await?;
                idx.into_iter().map(|i| (i, Some(bytes.to_vec()))).collect()
            }
            Err(object_store::Error::NotFound { .. }) => missing(idx),
            Err(e) => return Err(e),
        },
        ObjectReads::Ranges(bounded, open) => {
            let mut out = Vec::with_capacity(bounded.len() + open.len());
            if !bounded.is_empty() {
                let ranges: Vec<Range<u64>> = bounded.iter().map(|(_, r)| r.clone()).collect();
                match store.get_ranges(&path, &ranges).await {
                    Ok(parts) => {
                        for ((i, _), b) in bounded.iter().zip(parts) {
                            out.push((*i, Some(b.to_vec())));
                        }
                    }
                    Err(object_store::Error::NotFound { .. }) => {
                        out.extend(bounded.iter().map(|(i, _)| (*i, None)));
                    }
                    Err(e) => return Err(e),
                }
            }
            for (i, range) in open {
                let opts = GetOptions {
                    range: Some(range),
                    ..Default::default()
                };
                match store.get_opts(&path, opts).await {
                    Ok(r) => out.push((i, Some(r.bytes().await?.to_vec()))),
                    Err(object_store::Error::NotFound { .. }) => out.push((i, None)),
                    Err(e) => return Err(e),
                }
            }
            out
        }
    };
    drop(permit);
    Ok(result)
}
