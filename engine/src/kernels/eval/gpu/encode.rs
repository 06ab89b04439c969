//! Encoding chunks into zstd frames on the device with nvCOMP's batched encoder: chunks of
//! values already in device memory are compressed in one call, timed by events on the
//! encode's stream, and the frames copied back. nvCOMP picks its own compression level, so
//! its frames differ from libzstd's at a given level, but any zstd decoder reads them.

use cudarc::driver::result;

use super::device_array::DeviceArray;
use super::failure::{cuda_error, guarded};
use super::nvcomp::{nvcomp, status_name, EncodeCall, MAX_ENCODE_CHUNK};
use super::runtime::Gpu;
use crate::array::DType;
use crate::error::{Error, ErrorKind, Result};

/// Alignment of every region of the encode's argument buffer.
const ALIGN: usize = 256;

/// One chunk's values on the device: where they start in the values' buffer, and their
/// bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncodePiece {
    /// Offset in the buffer.
    pub at: usize,
    /// Bytes.
    pub len: usize,
}

/// The frames nvCOMP made, in the pieces' order, and the device time its encode took.
#[derive(Debug)]
pub struct DeviceEncoded {
    /// One zstd frame per piece.
    pub frames: Vec<Vec<u8>>,
    /// Seconds between events around the encode call.
    pub seconds: f64,
}

/// Where nvCOMP's argument arrays, statuses, temporary memory and frames lie in one device
/// allocation, for `count` chunks whose frames take at most `frame` bytes each.
#[derive(Debug, Clone, PartialEq, Eq)]
struct EncodeLayout {
    /// The four arrays of `count` u64 (inputs, input sizes, outputs, output sizes).
    args_at: usize,
    statuses_at: usize,
    temp_at: usize,
    /// Each frame's buffer.
    frames_at: Vec<usize>,
    /// Bytes of the whole allocation.
    total: usize,
}

fn encode_layout(
    count: usize,
    frame: usize,
    temp: usize,
    align_temp: usize,
    align_out: usize,
) -> EncodeLayout {
    let args_at = 0;
    let statuses_at = (args_at + 32 * count).next_multiple_of(ALIGN);
    let temp_at = (statuses_at + 4 * count).next_multiple_of(align_temp.max(ALIGN));
    let mut at = temp_at + temp;
    let frames_at = (0..count)
        .map(|_| {
            at = at.next_multiple_of(align_out.max(ALIGN));
            let here = at;
            at += frame;
            here
        })
        .collect();
    EncodeLayout {
        args_at,
        statuses_at,
        temp_at,
        frames_at,
        total: at.max(1),
    }
}

/// Whether `pieces` of `values_bytes` bytes can go to nvCOMP's encoder, whose inputs must
/// start on `align_in`; why not otherwise.
fn check_pieces(pieces: &[EncodePiece], values_bytes: usize, align_in: usize) -> Result<usize> {
    let mut largest = 0;
    for (i, p) in pieces.iter().enumerate() {
        if p.at + p.len > values_bytes {
            return Err(Error::internal(format!(
                "chunk {i} to encode lies outside the device buffer ({} + {} > {values_bytes})",
                p.at, p.len
            )));
        }
        if p.at % align_in.max(1) != 0 {
            return Err(Error::internal(format!(
                "chunk {i} to encode starts at {}, not on nvCOMP's {align_in}-byte alignment",
                p.at
            )));
        }
        if p.len > MAX_ENCODE_CHUNK {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "a chunk of {} bytes is over the {} bytes nvCOMP's zstd encoder takes",
                    p.len, MAX_ENCODE_CHUNK
                ),
            ));
        }
        largest = largest.max(p.len);
    }
    Ok(largest)
}

impl Gpu {
    /// Copies host `chunks` into one device buffer, each starting on nvCOMP's encoder's
    /// alignment; returns the buffer and where each lies in it.
    pub fn upload_pieces(
        &'static self,
        chunks: &[&[u8]],
    ) -> Result<(DeviceArray, Vec<EncodePiece>)> {
        let mut at = 0usize;
        let pieces: Vec<EncodePiece> = chunks
            .iter()
            .map(|c| {
                at = at.next_multiple_of(ALIGN);
                let p = EncodePiece { at, len: c.len() };
                at += c.len();
                p
            })
            .collect();
        let values = DeviceArray::alloc(self, &[at.max(1) as u64], DType::U8)?;
        guarded("copying chunks to the device", || {
            self.bind()?;
            for (c, p) in chunks.iter().zip(&pieces) {
                // SAFETY: the buffer holds `at` bytes; each chunk's range lies inside it.
                unsafe { result::memcpy_htod_sync(values.device_ptr() + p.at as u64, c) }
                    .map_err(|e| cuda_error("copying a chunk to the device", e))?;
            }
            Ok(())
        })?;
        Ok((values, pieces))
    }

    /// Encodes the chunks `pieces` of `values` (device memory) into zstd frames with nvCOMP
    /// in one call; fails naming why where nvCOMP or its encoder is missing, a chunk is too
    /// large, or nvCOMP reports a chunk it could not encode.
    pub fn encode_zstd(
        &'static self,
        values: &DeviceArray,
        pieces: &[EncodePiece],
    ) -> Result<DeviceEncoded> {
        let unsupported = |why: String| Error::new(ErrorKind::Unsupported, why);
        let nv = nvcomp().map_err(unsupported)?;
        let enc = nv
            .encoder
            .as_ref()
            .map_err(|why| unsupported(why.clone()))?;
        let largest = check_pieces(pieces, values.nbytes(), enc.alignments.input)?;
        if pieces.is_empty() {
            return Ok(DeviceEncoded {
                frames: Vec::new(),
                seconds: 0.0,
            });
        }
        let internal = |why: String| Error::new(ErrorKind::Internal, why);
        let count = pieces.len();
        let total: usize = pieces.iter().map(|p| p.len).sum();
        let frame = enc.max_compressed(largest).map_err(internal)?;
        let temp = enc.temp_bytes(count, largest, total).map_err(internal)?;
        let lay = encode_layout(
            count,
            frame,
            temp,
            enc.alignments.temp,
            enc.alignments.output,
        );
        guarded("encoding chunks on the device", || {
            self.bind()?;
            let scratch = DeviceArray::alloc(self, &[lay.total as u64], DType::U8)?;
            let base = scratch.device_ptr();
            let mut args: Vec<u64> = Vec::with_capacity(4 * count);
            args.extend(pieces.iter().map(|p| values.device_ptr() + p.at as u64));
            args.extend(pieces.iter().map(|p| p.len as u64));
            args.extend(lay.frames_at.iter().map(|&at| base + at as u64));
            args.extend(std::iter::repeat_n(0u64, count));
            // SAFETY: the allocation holds `total` bytes; the arguments take 32 per chunk at
            // `args_at`.
            unsafe { result::memcpy_htod_sync(base + lay.args_at as u64, &args[..]) }
                .map_err(|e| cuda_error("copying the encoder's arguments", e))?;
            let stream = self.new_stream()?;
            let (start, end) = (self.new_event()?, self.new_event()?);
            start
                .record(&stream)
                .map_err(|e| cuda_error("recording an event", e))?;
            let arg = |n: usize| base + (lay.args_at + 8 * count * n) as u64;
            let call = EncodeCall {
                inputs: arg(0),
                input_bytes: arg(1),
                largest,
                outputs: arg(2),
                output_bytes: arg(3),
                statuses: base + lay.statuses_at as u64,
                count,
                temp: (base + lay.temp_at as u64, temp),
            };
            // SAFETY: every array lies in `scratch`, laid out for `count` chunks; the inputs
            // lie in `values` (checked above), which outlives the synchronize below.
            unsafe { enc.encode_async(&call, stream.cu_stream()) }
                .map_err(|e| cuda_error("encoding chunks on the device", e))?;
            end.record(&stream)
                .map_err(|e| cuda_error("recording an event", e))?;
            stream
                .synchronize()
                .map_err(|e| cuda_error("waiting for the device's encode", e))?;
            let seconds = start
                .elapsed_ms(&end)
                .map(|ms| f64::from(ms) / 1e3)
                .map_err(|e| cuda_error("timing", e))?;
            let mut sizes = vec![0u64; count];
            let mut statuses = vec![0i32; count];
            // SAFETY: both arrays lie in `scratch`, written by the encode the stream ran.
            unsafe {
                result::memcpy_dtoh_sync(&mut sizes[..], arg(3))
                    .and_then(|()| {
                        result::memcpy_dtoh_sync(&mut statuses[..], base + lay.statuses_at as u64)
                    })
                    .map_err(|e| cuda_error("copying the encoder's sizes", e))?;
            }
            let mut frames = Vec::with_capacity(count);
            for (i, (&len, &status)) in sizes.iter().zip(&statuses).enumerate() {
                if status != 0 || len as usize > frame {
                    return Err(Error::new(
                        ErrorKind::Internal,
                        format!(
                            "nvCOMP could not encode chunk {i} of {count}: {} ({len} bytes)",
                            status_name(status)
                        ),
                    ));
                }
                let mut bytes = vec![0u8; len as usize];
                // SAFETY: the frame's buffer holds `frame` bytes, `len` of them written.
                unsafe { result::memcpy_dtoh_sync(&mut bytes[..], base + lay.frames_at[i] as u64) }
                    .map_err(|e| cuda_error("copying a frame to the host", e))?;
                frames.push(bytes);
            }
            Ok(DeviceEncoded { frames, seconds })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_keeps_every_region_aligned_and_apart() {
        let lay = encode_layout(3, 1000, 5000, 512, 8);
        assert_eq!((lay.args_at, lay.statuses_at), (0, 256));
        assert_eq!(lay.temp_at, 512);
        assert_eq!(lay.frames_at, vec![5632, 6656, 7680]);
        assert_eq!(lay.total, 8680);
        for w in lay.frames_at.windows(2) {
            assert!(w[1] - w[0] >= 1000);
        }
    }

    #[test]
    fn pieces_nvcomp_cannot_take_are_named() {
        let ok = [
            EncodePiece { at: 0, len: 100 },
            EncodePiece { at: 256, len: 300 },
        ];
        assert_eq!(check_pieces(&ok, 556, 4).unwrap(), 300);
        let outside = check_pieces(&[EncodePiece { at: 256, len: 301 }], 556, 4).unwrap_err();
        assert!(
            outside.to_string().contains("outside the device buffer"),
            "{outside}"
        );
        let odd = check_pieces(&[EncodePiece { at: 2, len: 8 }], 556, 4).unwrap_err();
        assert!(odd.to_string().contains("4-byte alignment"), "{odd}");
        let big = check_pieces(
            &[EncodePiece {
                at: 0,
                len: MAX_ENCODE_CHUNK + 1,
            }],
            usize::MAX,
            4,
        )
        .unwrap_err();
        assert!(big.to_string().contains("over the"), "{big}");
    }
}
