//! The `chunkfuse` command line: run plans, rechunk arrays, describe stores, measure codec
//! floors.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use chunkfuse_engine::exec::memory::{human_bytes, parse_bytes};
use chunkfuse_engine::plan::Plan;
use chunkfuse_engine::run::{
    self, Explained, RechunkChunks, RechunkOptions, RunOptions, RunSummary, StageRecord,
};
use chunkfuse_engine::zarr::Codec;
use chunkfuse_engine::{Error, ErrorKind};
use clap::{Args, Parser, Subcommand};

#[path = "chunkfuse/bench.rs"]
mod bench;
use bench::{bench_command, BenchCommand};

#[derive(Parser)]
#[command(
    name = "chunkfuse",
    version,
    about = "Fused, memory-bounded execution of chunked-array plans over Zarr"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// How local files are read: auto (io_uring where the system allows it, large whole
    /// files mapped), uring, or pread (a thread pool). Default: $CHUNKFUSE_IO, else auto.
    #[arg(long, global = true, value_name = "auto|uring|pread")]
    io: Option<String>,
    /// Seconds one object-storage request may take before it fails (and is retried).
    /// Default: $CHUNKFUSE_IO_TIMEOUT_S, else 30.
    #[arg(long, global = true, value_name = "SECONDS")]
    io_timeout: Option<f64>,
    /// Seconds to connect to an object-storage server. Default:
    /// $CHUNKFUSE_IO_CONNECT_TIMEOUT_S, else 10.
    #[arg(long, global = true, value_name = "SECONDS")]
    io_connect_timeout: Option<f64>,
    /// Seconds within which failed object-storage requests are retried. Default:
    /// $CHUNKFUSE_IO_RETRY_TIMEOUT_S, else 60.
    #[arg(long, global = true, value_name = "SECONDS")]
    io_retry_timeout: Option<f64>,
}

#[derive(Args)]
struct Common {
    /// Memory budget (e.g. 2GB, 512MiB); default a quarter of available memory.
    #[arg(long)]
    max_mem: Option<String>,
    /// Compute threads (default: all cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Directory for intermediates (default: the system temporary directory).
    #[arg(long)]
    work_dir: Option<std::path::PathBuf>,
    /// Print a JSON summary on stdout instead of text.
    #[arg(long)]
    json: bool,
    /// Start over: do not reuse what an unfinished run of the same job wrote (by default a
    /// rerun keeps every chunk it finds and computes only the rest).
    #[arg(long)]
    fresh: bool,
    /// Where fused elementwise programs and reductions run: cpu, cuda (an NVIDIA GPU; an
    /// error without one) or auto (the GPU when present). FFTs and codecs run on the CPU.
    /// Default: $CHUNKFUSE_DEVICE, else cpu.
    #[arg(long, value_name = "cpu|cuda|auto")]
    device: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Validate and run a JSON plan.
    Run {
        /// The plan file.
        plan: std::path::PathBuf,
        /// Plan parameter, NAME=VALUE (repeatable).
        #[arg(long = "param", value_name = "NAME=VALUE")]
        params: Vec<String>,
        #[command(flatten)]
        common: Common,
    },
    /// Show how a JSON plan would run, without running it: its stages, what fused into
    /// each, how each stage's tasks read (bands, streams, kept chunks, shared inputs) and
    /// the bytes the largest task reserves against the budget.
    Explain {
        /// The plan file.
        plan: std::path::PathBuf,
        /// Plan parameter, NAME=VALUE (repeatable).
        #[arg(long = "param", value_name = "NAME=VALUE")]
        params: Vec<String>,
        #[command(flatten)]
        common: Common,
    },
    /// Copy an array, or every array of a group, into a new chunking with bounded memory.
    /// Targets keep their source's attributes, dimension names and fill value; a group
    /// target takes the source group's attributes (and consolidated metadata when the
    /// source has some).
    Rechunk {
        /// Source array or group (Zarr v2 or v3).
        source: String,
        /// Target array or group (written as Zarr v3 unless --zarr-format 2).
        target: String,
        /// Target chunk shape per axis, e.g. 256,73,144, or by dimension name, e.g.
        /// time=-1,latitude=10 (axes not named keep their chunks; a group's chunks are given
        /// by name). -1: the whole axis.
        #[arg(
            long,
            required = true,
            allow_hyphen_values = true,
            value_name = "SIZES"
        )]
        chunks: String,
        /// Shard shape (Zarr v3), a multiple of the chunks; per axis or by dimension name as
        /// --chunks (-1: the whole axis).
        #[arg(long, allow_hyphen_values = true, value_name = "SIZES")]
        shards: Option<String>,
        /// Replace an array or group already at the target. Without it, only a target that
        /// an unfinished run of this same job left is accepted (and resumed).
        #[arg(long)]
        overwrite: bool,
        /// Compressor: zstd[:LEVEL], blosc[:CNAME[:CLEVEL[:SHUFFLE]]], gzip[:LEVEL] or none.
        #[arg(long, default_value = "zstd:3")]
        codec: String,
        /// Zarr format of the target: 2 or 3.
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(2..=3))]
        zarr_format: u8,
        #[command(flatten)]
        common: Common,
    },
    /// Describe an array (shape, chunks, shards, codecs, sizes), or each array of a group.
    Info {
        /// The array or group.
        store: String,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Codec floors for benchmarks (no IO timed).
    Bench {
        #[command(subcommand)]
        what: BenchCommand,
    },
}

fn exit_code(e: &Error) -> u8 {
    match e.kind {
        ErrorKind::Plan | ErrorKind::Unsupported => 2,
        ErrorKind::Cancelled => 130,
        _ => 1,
    }
}

fn options(common: &Common, cancel: Arc<AtomicBool>) -> Result<RunOptions, Error> {
    Ok(RunOptions {
        max_mem: common
            .max_mem
            .as_deref()
            .map(parse_bytes)
            .transpose()
            .map_err(|e| e.with_field("--max-mem"))?,
        threads: common.threads,
        io_threads: 8,
        work_dir: common.work_dir.clone(),
        progress: !common.json,
        cancel,
        observe: None,
        resume: !common.fresh,
        device: match common
            .device
            .clone()
            .or_else(|| std::env::var("CHUNKFUSE_DEVICE").ok())
        {
            Some(d) => d.parse().map_err(|e: Error| e.with_field("--device"))?,
            None => Default::default(),
        },
        batched: false,
        spread: 0,
    })
}

/// Where a stage ran on a run with a GPU, and why a part of it did not (nothing on a CPU run).
fn device_line(st: &StageRecord) -> Option<String> {
    match (st.device.as_str(), &st.device_note) {
        ("gpu", None) => Some("on the GPU".to_string()),
        ("gpu", Some(note)) => Some(format!("on the GPU; {note}")),
        (_, Some(note)) => Some(format!("on the CPU: {note}")),
        _ => None,
    }
}

fn print_summary(s: &RunSummary, json: bool) -> Result<(), Error> {
    if json {
        let text = serde_json::to_string(s).map_err(|e| Error::internal(e.to_string()))?;
        println!("{text}");
        return Ok(());
    }
    println!(
        "{}: {} task(s) in {:.2} s on {} thread(s)",
        s.plan, s.tasks, s.seconds, s.threads
    );
    for st in &s.stages {
        println!("  stage: {}", st.describe());
        if let Some(line) = device_line(st) {
            println!("    {line}");
        }
    }
    if s.device != "cpu" {
        println!(
            "  device {}: {} block(s) computed there",
            s.device, s.gpu_blocks
        );
    }
    let gbs = |b: u64| b as f64 / 1e9 / s.seconds.max(1e-9);
    println!(
        "  read {} ({:.2} GB/s), decoded {} ({:.2} GB/s), wrote {}",
        human_bytes(s.bytes_read),
        gbs(s.bytes_read),
        human_bytes(s.decoded_bytes),
        gbs(s.decoded_bytes),
        human_bytes(s.bytes_written)
    );
    println!(
        "  peak RSS {} (budget {})",
        human_bytes(s.peak_rss),
        human_bytes(s.max_mem)
    );
    for o in &s.outputs {
        println!("  wrote {o}");
    }
    Ok(())
}

fn print_json<T: serde::Serialize>(v: &T) -> Result<(), Error> {
    let text = serde_json::to_string(v).map_err(|e| Error::internal(e.to_string()))?;
    println!("{text}");
    Ok(())
}

/// Applies the `--io-*timeout` options (each over the environment and the defaults).
fn set_timeouts(cli: &Cli) -> Result<(), Error> {
    use chunkfuse_engine::store::object::{set_timeouts, Timeouts};
    let given = [
        ("--io-connect-timeout", cli.io_connect_timeout),
        ("--io-timeout", cli.io_timeout),
        ("--io-retry-timeout", cli.io_retry_timeout),
    ];
    if given.iter().all(|(_, v)| v.is_none()) {
        return Ok(());
    }
    let mut seconds = [None; 3];
    for (slot, (flag, value)) in seconds.iter_mut().zip(given) {
        if let Some(v) = value {
            if !(v.is_finite() && v >= 0.0) {
                return Err(Error::plan(flag, format!("must be seconds >= 0, got {v}")));
            }
            *slot = Some(std::time::Duration::from_secs_f64(v));
        }
    }
    let now = Timeouts::current();
    set_timeouts(Some(Timeouts {
        connect: seconds[0].unwrap_or(now.connect),
        request: seconds[1].unwrap_or(now.request),
        retry: seconds[2].unwrap_or(now.retry),
    }))
    .map_err(|e| e.with_field("--io-timeout"))
}

/// Reads the plan file `path` with its `NAME=VALUE` parameters.
fn read_plan(path: &std::path::Path, params: &[String]) -> Result<Plan, Error> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::plan("plan", format!("cannot read {}: {e}", path.display())))?;
    Plan::from_json(&text, &run::parse_params(params)?)
}

fn print_explained(e: &Explained, json: bool) -> Result<(), Error> {
    if json {
        return print_json(e);
    }
    println!(
        "{}: {} stage(s); budget {} ({} for tasks) on {} thread(s), {}",
        e.plan,
        e.stages.len(),
        human_bytes(e.max_mem),
        human_bytes(e.task_budget),
        e.threads,
        e.device
    );
    for st in &e.stages {
        println!("  stage {}: {}", st.index, st.describe());
        println!(
            "    {} stage, {}: {} task(s) in {} part(s), the largest reserving {} of {}",
            st.kind.name(),
            st.strategy.name(),
            st.tasks,
            st.parts,
            human_bytes(st.largest_task_bytes),
            human_bytes(st.task_budget)
        );
        println!("    reads {}", st.reads.join("; "));
        if !st.fused.is_empty() {
            println!("    fused {}", st.fused.join(", "));
        }
        println!("    writes {}", st.output);
        if let Some(line) = device_line(st) {
            println!("    {line}");
        }
    }
    Ok(())
}

fn rechunk_command(
    source: &str,
    target: &str,
    options: RechunkOptions,
    common: &Common,
    cancel: Arc<AtomicBool>,
) -> Result<(), Error> {
    let plan = run::rechunk_plan(source, target, &options)?;
    let summary = run::run_plan(&plan, &self::options(common, cancel)?)?;
    print_summary(&summary, common.json)
}

fn info_command(store: &str, json: bool) -> Result<(), Error> {
    if let Some(group) = run::group_info(store)? {
        if json {
            return print_json(&group);
        }
        println!(
            "{store}: a Zarr v{} group of {} array(s){}",
            group.zarr_format,
            group.arrays.len(),
            match group.groups.len() {
                0 => String::new(),
                n => format!(" and {n} nested group(s)"),
            }
        );
        for a in &group.arrays {
            match (&a.info, &a.note) {
                (Some(s), _) => println!(
                    "  {:<12} {:?} {} in chunks {:?}, {} stored ({:.1}x)",
                    a.name,
                    s.info.shape,
                    s.info.dtype,
                    s.info.chunks,
                    human_bytes(s.stored_bytes),
                    s.compression_ratio
                ),
                (None, note) => println!("  {:<12} {}", a.name, note.as_deref().unwrap_or("")),
            }
        }
        for g in &group.groups {
            println!("  {g:<12} a nested group (`chunkfuse info {store}/{g}` describes it)");
        }
        return Ok(());
    }
    let info = run::info(store)?;
    if json {
        return print_json(&info);
    }
    let i = &info.info;
    println!("{store}");
    println!("  zarr format  {}", i.zarr_format);
    println!("  shape        {:?}", i.shape);
    println!("  dtype        {}", i.dtype);
    println!("  chunks       {:?}", i.chunks);
    if let Some(s) = &i.shards {
        println!("  shards       {s:?}");
    }
    println!("  codecs       {}", i.codecs.join(", "));
    println!("  fill value   {}", i.fill_value);
    println!("  decoded size {}", human_bytes(i.nbytes));
    println!(
        "  stored size  {} in {} chunk(s)",
        human_bytes(info.stored_bytes),
        info.stored_chunks
    );
    println!("  compression  {:.2}x", info.compression_ratio);
    Ok(())
}

fn main_inner(cli: Cli, cancel: Arc<AtomicBool>) -> Result<(), Error> {
    if let Some(io) = &cli.io {
        let mode =
            chunkfuse_engine::store::uring::IoMode::parse(io).map_err(|e| e.with_field("--io"))?;
        chunkfuse_engine::store::uring::set_io_mode(mode);
    }
    set_timeouts(&cli)?;
    match cli.command {
        Command::Run {
            plan,
            params,
            common,
        } => {
            let plan = read_plan(&plan, &params)?;
            let summary = run::run_plan(&plan, &options(&common, cancel)?)?;
            print_summary(&summary, common.json)
        }
        Command::Explain {
            plan,
            params,
            common,
        } => {
            let plan = read_plan(&plan, &params)?;
            let explained = run::explain_plan(&plan, &options(&common, cancel)?)?;
            print_explained(&explained, common.json)
        }
        Command::Rechunk {
            source,
            target,
            chunks,
            shards,
            overwrite,
            codec,
            zarr_format,
            common,
        } => {
            let options = RechunkOptions {
                chunks: RechunkChunks::parse_cli(&chunks, "--chunks")?,
                shards: shards
                    .map(|s| RechunkChunks::parse_cli(&s, "--shards"))
                    .transpose()?,
                codec: Codec::parse_cli(&codec).map_err(|e| e.with_field("--codec"))?,
                zarr_format,
                overwrite,
            };
            rechunk_command(&source, &target, options, &common, cancel)
        }
        Command::Info { store, json } => info_command(&store, json),
        Command::Bench { what } => bench_command(what),
    }
}

fn main() -> ExitCode {
    chunkfuse_engine::exec::memory::configure_allocator();
    let cli = Cli::parse();
    let cancel = Arc::new(AtomicBool::new(false));
    let flag = cancel.clone();
    // First Ctrl-C cancels cleanly; a second one exits at once.
    let _ = ctrlc::set_handler(move || {
        if flag.swap(true, Ordering::SeqCst) {
            std::process::exit(130);
        }
        eprintln!("chunkfuse: cancelling (press Ctrl-C again to exit at once)");
    });
    // Waits on IO (metadata, `info`, reads) end at the first Ctrl-C too (exit 130).
    let scoped = cancel.clone();
    match chunkfuse_engine::cancel::scope(scoped, || main_inner(cli, cancel)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("chunkfuse: {e}");
            ExitCode::from(exit_code(&e))
        }
    }
}
