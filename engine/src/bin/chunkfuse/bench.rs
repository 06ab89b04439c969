//! `chunkfuse bench`: the floors runs are measured against (reading, decoding, encoding,
//! rechunking's codecs), no compute.

use chunkfuse_engine::exec::memory::human_bytes;
use chunkfuse_engine::run::{self, RechunkChunks};
use chunkfuse_engine::zarr::Codec;
use chunkfuse_engine::{Error, ErrorKind};
use clap::Subcommand;

use super::print_json;

/// What `chunkfuse bench` measures.
#[derive(Subcommand)]
pub enum BenchCommand {
    /// Time reading and decoding every chunk through the engine's IO threads and scheduler,
    /// with no compute (the floor of a reduction such as plans/era5-sum.json).
    Read {
        /// The array.
        source: String,
        /// Threads (default: all cores).
        #[arg(long, default_value_t = 0)]
        threads: usize,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Time decoding every chunk of an array already read into memory.
    Decode {
        /// The array.
        source: String,
        /// Threads (default: all cores).
        #[arg(long, default_value_t = 0)]
        threads: usize,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Time encoding every chunk of an array already decoded in memory with libzstd on all
    /// cores and, with `--device cuda`, with nvCOMP on the GPU (frames checked by libzstd).
    Encode {
        /// The array.
        source: String,
        /// libzstd's level.
        #[arg(long, default_value_t = 3)]
        level: i32,
        /// `cpu`, or `cuda` to time nvCOMP's encoder too.
        #[arg(long, default_value = "cpu")]
        device: String,
        /// Threads (default: all cores).
        #[arg(long, default_value_t = 0)]
        threads: usize,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Time decoding every chunk and encoding every chunk of a new chunking.
    Codec {
        /// The array.
        source: String,
        /// Target chunk shape, per axis or by dimension name (time=-1,latitude=10); -1: the
        /// whole axis.
        #[arg(long, required = true, allow_hyphen_values = true)]
        chunks: String,
        /// Target compressor.
        #[arg(long, default_value = "zstd:3")]
        codec: String,
        /// Threads (default: all cores).
        #[arg(long, default_value_t = 0)]
        threads: usize,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `chunkfuse bench WHAT`.
pub fn bench_command(what: BenchCommand) -> Result<(), Error> {
    let gbs = |bytes: u64, seconds: f64| bytes as f64 / 1e9 / seconds.max(1e-9);
    match what {
        BenchCommand::Read {
            source,
            threads,
            json,
        } => {
            let f = run::read_floor(&source, threads, None)?;
            if json {
                return print_json(&f);
            }
            println!(
                "read and decoded {} in {:.3} s ({:.2} GB/s) on {} thread(s)",
                human_bytes(f.decoded_bytes),
                f.seconds,
                gbs(f.decoded_bytes, f.seconds),
                f.threads
            );
        }
        BenchCommand::Decode {
            source,
            threads,
            json,
        } => {
            let f = run::codec_floor(&source, threads, None)?;
            if json {
                return print_json(&f);
            }
            println!(
                "decoded {} in {:.3} s ({:.2} GB/s) on {} thread(s)",
                human_bytes(f.decoded_bytes),
                f.decode_seconds,
                gbs(f.decoded_bytes, f.decode_seconds),
                f.threads
            );
        }
        BenchCommand::Encode {
            source,
            level,
            device,
            threads,
            json,
        } => {
            let on_gpu = match device.as_str() {
                "cpu" => false,
                "cuda" | "gpu" => true,
                other => {
                    return Err(Error::new(
                        ErrorKind::Plan,
                        format!("unknown device {other:?}: expected cpu or cuda"),
                    )
                    .with_field("--device"))
                }
            };
            let f = run::encode_floor(&source, threads, level, on_gpu)?;
            if json {
                return print_json(&f);
            }
            let ratio = |c: u64| f.decoded_bytes as f64 / c.max(1) as f64;
            println!(
                "libzstd level {}: encoded {} in {:.3} s ({:.2} GB/s, ratio {:.2}) on {} thread(s)",
                f.level,
                human_bytes(f.decoded_bytes),
                f.cpu_seconds,
                gbs(f.decoded_bytes, f.cpu_seconds),
                ratio(f.cpu_compressed_bytes),
                f.threads
            );
            if let Some(d) = &f.device {
                println!(
                    "nvCOMP on {}: encoded in {:.3} s ({:.2} GB/s, ratio {:.2}) after {:.3} s of \
                     upload; {} of {} frames decode back ({} record their size)",
                    d.device,
                    d.encode_seconds,
                    gbs(f.decoded_bytes, d.encode_seconds),
                    ratio(d.compressed_bytes),
                    d.upload_seconds,
                    d.frames_verified,
                    f.chunks,
                    d.frames_with_content_size
                );
            }
        }
        BenchCommand::Codec {
            source,
            chunks,
            codec,
            threads,
            json,
        } => {
            let codec = Codec::parse_cli(&codec).map_err(|e| e.with_field("--codec"))?;
            let sizes = RechunkChunks::parse_cli(&chunks, "--chunks")?;
            let chunks = run::array_chunks(&source, &sizes, "--chunks")?;
            let f = run::codec_floor(&source, threads, Some((&chunks, &codec)))?;
            if json {
                return print_json(&f);
            }
            println!(
                "decode {:.3} s + encode {:.3} s = {:.3} s on {} thread(s)",
                f.decode_seconds, f.encode_seconds, f.seconds, f.threads
            );
        }
    }
    Ok(())
}
