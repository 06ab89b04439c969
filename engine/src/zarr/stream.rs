//! Chunks encoded as streams: a chunk's values arrive a few rows (slices along the first
//! axis) at a time, in order, and leave as encoded parts, so a rechunk whose output chunks
//! each gather a slice of every input chunk needs neither the whole chunk in memory nor an
//! intermediate array. Only formats whose encoded bytes are one stream of the chunk's C-order
//! bytes qualify: unsharded `bytes` (little-endian) alone or followed by `zstd`.

use zstd::zstd_safe::zstd_sys::ZSTD_EndDirective;
use zstd::zstd_safe::{CCtx, CParameter, InBuffer, OutBuffer};

use super::{FastCodec, ZarrArray, ZstdParams};
use crate::array::buffer::copy_region;
use crate::array::Region;
use crate::error::{Error, ErrorKind, Result};

/// How a chunk stream encodes.
enum Encoder {
    /// Stored as they are.
    Raw,
    /// One zstd frame (its content size in the header, as one-shot compression writes it).
    Zstd(Box<CCtx<'static>>),
}

/// One chunk being encoded from rows that arrive in order.
pub struct ChunkStream {
    key: String,
    encoder: Encoder,
    /// Encoded bytes not yet handed out.
    pending: Vec<u8>,
    /// Offset in the encoded value of `pending`'s first byte.
    offset: u64,
    /// Bytes of one row as the caller gives it (the chunk's region inside the array).
    row_bytes: usize,
    /// The shape of a row of the region and of a stored row, which edge chunks pad with
    /// fill past the array's edge.
    row_shape: Vec<u64>,
    stored_row_shape: Vec<u64>,
    /// Bytes of one stored row.
    stored_row_bytes: usize,
    item: usize,
    /// Rows in the region, rows stored (the region's plus padding), rows fed so far.
    rows: u64,
    stored_rows: u64,
    fed: u64,
    /// A stored row of fill (empty when rows are not padded).
    fill_row: Vec<u8>,
    /// The row being padded.
    padded: Vec<u8>,
    /// One element of fill.
    fill: Vec<u8>,
}

fn stream_error(array: &ZarrArray, key: &str, e: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Internal, format!("cannot encode chunk: {e}"))
        .with_array(&array.name)
        .with_chunk_key(key)
        .with_store(&array.url)
}

/// A zstd context set up for one frame of `len` bytes.
fn zstd_context(params: ZstdParams, len: u64) -> std::result::Result<CCtx<'static>, String> {
    let mut c = CCtx::try_create().ok_or("cannot allocate a zstd context")?;
    let code = |r: std::result::Result<usize, usize>| {
        r.map(|_| ())
            .map_err(|c| zstd::zstd_safe::get_error_name(c).to_string())
    };
    code(c.set_parameter(CParameter::CompressionLevel(params.level)))?;
    code(c.set_parameter(CParameter::ChecksumFlag(params.checksum)))?;
    code(c.set_pledged_src_size(Some(len)))?;
    Ok(c)
}

/// Bytes one open zstd stream of `level` holds for chunks of `chunk_bytes` (its window,
/// tables and buffers), measured on a context set up the way chunk streams are.
pub fn zstd_stream_bytes(level: i32, chunk_bytes: u64) -> Option<u64> {
    let params = ZstdParams {
        level,
        checksum: false,
    };
    let mut c = zstd_context(params, chunk_bytes.max(1)).ok()?;
    // The context allocates its workspace when the frame starts.
    let one = [0u8; 1];
    let mut input = InBuffer::around(&one);
    let mut out: Vec<u8> = Vec::new();
    zstd_step(
        &mut c,
        &mut out,
        &mut input,
        ZSTD_EndDirective::ZSTD_e_continue,
    )
    .ok()?;
    Some(c.sizeof() as u64)
}

impl ZarrArray {
    /// True when chunks can be written as streams ([`chunk_stream`](Self::chunk_stream)).
    pub fn streams_chunks(&self) -> bool {
        self.info.shards.is_none()
            && self.window.is_none()
            && (self.fast == Some(FastCodec::Raw) || self.fast_encode.is_some())
    }

    /// The codec chunk streams encode with, when chunks can be streamed.
    pub fn stream_codec(&self) -> Option<super::Codec> {
        if !self.streams_chunks() {
            return None;
        }
        match (self.fast, self.fast_encode) {
            (Some(FastCodec::Raw), _) => Some(super::Codec::None),
            (_, Some(p)) => Some(super::Codec::Zstd { level: p.level }),
            _ => None,
        }
    }

    /// A stream encoding chunk `idx`, fed its region's rows in order.
    pub fn chunk_stream(&self, idx: &[u64]) -> Result<ChunkStream> {
        let key = self.chunk_key(idx);
        if !self.streams_chunks() {
            return Err(stream_error(
                self,
                &key,
                "this array's codecs cannot encode a chunk as a stream",
            ));
        }
        let region = self.grid.chunk_region(idx);
        let stored = self.encoded_chunk_shape(idx)?;
        let item = self.dtype.size();
        let rank = region.rank();
        if rank == 0 || stored.len() != rank {
            return Err(stream_error(
                self,
                &key,
                "a chunk stream needs rank 1 or more",
            ));
        }
        let rows = region.shape[0];
        let stored_rows = stored[0].max(rows);
        let row_elems: u64 = region.shape[1..].iter().product();
        let stored_row_elems: u64 = stored[1..].iter().product();
        let row_shape = region.shape[1..].to_vec();
        let stored_row_shape = stored[1..].to_vec();
        let fill_row = if row_shape == stored_row_shape {
            Vec::new()
        } else {
            let mut row = Vec::new();
            extend_with_fill(&mut row, &self.fill, stored_row_elems as usize * item);
            row
        };
        let total = stored_rows * stored_row_elems * item as u64;
        let encoder = match (self.fast, self.fast_encode) {
            (Some(FastCodec::Raw), _) => Encoder::Raw,
            (_, Some(params)) => Encoder::Zstd(Box::new(
                zstd_context(params, total).map_err(|e| stream_error(self, &key, e))?,
            )),
            _ => {
                return Err(stream_error(
                    self,
                    &key,
                    "this array's codecs cannot encode a chunk as a stream",
                ))
            }
        };
        Ok(ChunkStream {
            key,
            encoder,
            pending: Vec::new(),
            offset: 0,
            row_bytes: row_elems as usize * item,
            row_shape,
            stored_row_shape,
            stored_row_bytes: stored_row_elems as usize * item,
            item,
            rows,
            stored_rows,
            fed: 0,
            fill_row,
            fill: self.fill.clone(),
            padded: Vec::new(),
        })
    }
}

impl ChunkStream {
    /// The chunk's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Rows fed so far.
    pub fn rows_fed(&self) -> u64 {
        self.fed
    }

    /// Feeds the next rows: `values` holds whole rows of the chunk's region, C order.
    pub fn feed_rows(&mut self, values: &[u8]) -> std::result::Result<(), String> {
        if self.row_bytes == 0 || !values.len().is_multiple_of(self.row_bytes) {
            return Err(format!(
                "{} bytes is not a whole number of {}-byte rows",
                values.len(),
                self.row_bytes
            ));
        }
        let n = (values.len() / self.row_bytes) as u64;
        if self.fed + n > self.rows {
            return Err(format!(
                "{} rows fed to a chunk of {} rows",
                self.fed + n,
                self.rows
            ));
        }
        self.fed += n;
        if self.fill_row.is_empty() {
            return self.encode(values);
        }
        // An edge chunk: each row is stored padded with fill.
        let from = Region::whole(&self.row_shape);
        let to = Region::whole(&self.stored_row_shape);
        let mut row = std::mem::take(&mut self.padded);
        for src in values.chunks_exact(self.row_bytes) {
            row.clear();
            row.extend_from_slice(&self.fill_row);
            copy_region(src, &from, &mut row, &to, &from, self.item);
            self.encode(&row)?;
        }
        self.padded = row;
        Ok(())
    }

    /// Encoded bytes ready to write, with their offset in the value, once at least `min`
    /// bytes are waiting.
    pub fn take_part(&mut self, min: usize) -> Option<(u64, Vec<u8>)> {
        if self.pending.len() < min.max(1) {
            return None;
        }
        let bytes = std::mem::take(&mut self.pending);
        let offset = self.offset;
        self.offset += bytes.len() as u64;
        Some((offset, bytes))
    }

    /// Ends the chunk (after every row of its region was fed): the last encoded bytes, their
    /// offset, and the encoded value's total length.
    pub fn finish(mut self) -> std::result::Result<(u64, Vec<u8>, u64), String> {
        if self.fed != self.rows {
            return Err(format!(
                "chunk ended after {} of its {} rows",
                self.fed, self.rows
            ));
        }
        // Rows past the array's edge are stored as fill.
        if self.stored_rows > self.rows {
            let mut row = Vec::with_capacity(self.stored_row_bytes);
            extend_with_fill(&mut row, &self.fill, self.stored_row_bytes);
            for _ in self.rows..self.stored_rows {
                self.encode(&row)?;
            }
        }
        if let Encoder::Zstd(c) = &mut self.encoder {
            let mut input = InBuffer::around(&[]);
            while zstd_step(
                c,
                &mut self.pending,
                &mut input,
                ZSTD_EndDirective::ZSTD_e_end,
            )? > 0
            {}
        }
        let total = self.offset + self.pending.len() as u64;
        Ok((self.offset, self.pending, total))
    }

    /// Encodes stored bytes into `pending`.
    fn encode(&mut self, bytes: &[u8]) -> std::result::Result<(), String> {
        match &mut self.encoder {
            Encoder::Raw => {
                self.pending.extend_from_slice(bytes);
                Ok(())
            }
            Encoder::Zstd(c) => {
                let mut input = InBuffer::around(bytes);
                while input.pos() < bytes.len() {
                    zstd_step(
                        c,
                        &mut self.pending,
                        &mut input,
                        ZSTD_EndDirective::ZSTD_e_continue,
                    )?;
                }
                Ok(())
            }
        }
    }
}

/// One `compress_stream2` call appending to `out` (room for a block made first); returns what
/// zstd says is left to flush.
fn zstd_step(
    c: &mut CCtx<'static>,
    out: &mut Vec<u8>,
    input: &mut InBuffer<'_>,
    directive: ZSTD_EndDirective,
) -> std::result::Result<usize, String> {
    out.reserve(CCtx::out_size());
    let pos = out.len();
    let mut output = OutBuffer::around_pos(out, pos);
    c.compress_stream2(&mut output, input, directive)
        .map_err(|code| zstd::zstd_safe::get_error_name(code).to_string())
}

/// Appends `n` bytes of repeated `fill` elements.
fn extend_with_fill(out: &mut Vec<u8>, fill: &[u8], n: usize) {
    if fill.is_empty() || fill.iter().all(|&b| b == 0) {
        out.resize(out.len() + n, 0);
        return;
    }
    let end = out.len() + n;
    while out.len() < end {
        let take = fill.len().min(end - out.len());
        out.extend_from_slice(&fill[..take]);
    }
}
