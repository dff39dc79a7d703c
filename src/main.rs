//! The kvtarget daemon and its command line: the target itself (`--config`),
//! configuration and pool checks, the JSON-RPC client, the live view (`top`),
//! the load generator, and offline pool, volume and PCI tools. Parsing is
//! clap's; each subcommand keeps the exit codes scripts rely on (see
//! `usage_exit_code`).

use clap::error::ErrorKind;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use kvtarget::config::{parse_size, Config};
use kvtarget::server::Server;
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

mod top;

/// Exit code of a configuration error (scripts and tests check it).
const EXIT_CONFIG: u8 = 2;
/// Exit code of a usage error.
const EXIT_USAGE: u8 = 2;

/// NVMe-over-Fabrics target for KV-cache volumes.
///
/// Without a subcommand, runs the target described by --config until SIGINT or
/// SIGTERM stops it cleanly.
#[derive(Parser)]
#[command(name = "kvtarget")]
struct Cli {
    /// Configuration file (see config/default.toml)
    #[arg(short, long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Log filter, e.g. info, debug, kvtarget=trace [default: info, or RUST_LOG]
    #[arg(short, long, value_name = "FILTER")]
    log: Option<String>,
    /// JSON-RPC socket [default: [rpc] socket, else /var/tmp/kvtarget.sock]
    #[arg(short = 'r', long, value_name = "PATH")]
    rpc_socket: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Validate a configuration and exit (a wrong one: one line naming the field, exit 2)
    CheckConfig {
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
    /// Verify a pool offline (file or block device): exit 0 consistent, 1 damaged
    /// (with a report), 2 unusable
    Check {
        #[arg(value_name = "POOL")]
        pool: PathBuf,
    },
    /// Call a JSON-RPC method of a running target (SPDK names, e.g.
    /// nvmf_get_subsystems, nvmf_subsystem_add_ns, bdev_lvol_create;
    /// rpc_get_methods lists them)
    Rpc(RpcArgs),
    /// NVMe/TCP load generator (spdk_nvme_perf-like)
    Perf(PerfArgs),
    /// Hand NVMe controllers to vfio-pci (for the nvme backend) or back to the kernel
    #[command(subcommand)]
    Nvme(NvmeCommand),
    /// Offline pool management (the target must not be running on that pool)
    #[command(subcommand)]
    Pool(PoolCommand),
    /// Offline volume management (the target must not be running on that pool)
    #[command(subcommand)]
    Volume(VolumeCommand),
    /// A running target's cluster membership (etcd; see docs/cluster.md)
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Live view of a running target: reactors, namespaces, pools, cluster
    /// roles (q quits)
    Top(TopArgs),
    /// Write the man pages (kvtarget.1 and one per subcommand) into a directory
    #[command(hide = true)]
    Man {
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
}

#[derive(Args)]
struct TopArgs {
    /// The target's JSON-RPC socket
    #[arg(short = 'r', long = "rpc-socket", value_name = "SOCKET",
          default_value = kvtarget::rpc::DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Seconds between refreshes (fractions allowed)
    #[arg(short = 'd', long, value_name = "S", value_parser = positive_seconds, default_value = "1")]
    delay: Duration,
    /// Print one plain snapshot (rates over one --delay) and exit
    #[arg(long)]
    once: bool,
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// This node's state and lease, and every member with its listeners
    Status {
        /// The target's JSON-RPC socket
        #[arg(short = 'r', long = "rpc-socket", value_name = "SOCKET",
              default_value = kvtarget::rpc::DEFAULT_SOCKET)]
        socket: PathBuf,
        /// Print kvtarget_get_cluster's JSON instead of a table
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args)]
struct RpcArgs {
    /// The target's JSON-RPC socket
    #[arg(short = 'r', long = "rpc-socket", visible_short_alias = 's', value_name = "SOCKET",
          default_value = kvtarget::rpc::DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Print the result as JSON instead of a table
    #[arg(long)]
    json: bool,
    /// Method name
    method: String,
    /// One JSON object, or key=value pairs (a value is JSON when it parses as
    /// JSON, else a string; a dotted key nests: listen_address.traddr=...)
    #[arg(value_name = "PARAMS")]
    params: Vec<String>,
}

/// The load generator. Queues spread over one pinned thread per --cpus entry; a
/// progress line goes to stderr each second.
#[derive(Args)]
struct PerfArgs {
    /// Target address
    #[arg(long, value_name = "ADDRESS:PORT",
          required_unless_present_any = ["echo_baseline", "server_cpu"])]
    addr: Option<SocketAddr>,
    /// Subsystem NQN
    #[arg(long, required_unless_present_any = ["echo_baseline", "server_cpu"])]
    nqn: Option<String>,
    /// Host NQN to connect as
    #[arg(long, value_name = "NQN")]
    hostnqn: Option<String>,
    /// Namespace ID [default: 1]
    #[arg(long)]
    nsid: Option<u32>,
    /// randread, randwrite, randrw, read, write, or LMCache's raw-block phases:
    /// lmcache-store (4 KiB header + --bs payload per slot) and lmcache-retrieve;
    /// with --kv also list: every key, paged by List commands of --bs-byte host
    /// buffers on one queue, until done or --time runs out, and exist: Exist of
    /// random keys (stored first with --bs-byte values) [default: randread]
    #[arg(long, value_name = "W", value_parser = workload)]
    workload: Option<kvtarget::perf::Workload>,
    /// Percent of reads in randrw
    #[arg(long, value_name = "PCT", value_parser = clap::value_parser!(u32).range(0..=100))]
    rwmix_read: Option<u32>,
    /// Percent of writes sent as deallocates (churn for thin volumes)
    #[arg(long, value_name = "PCT", value_parser = clap::value_parser!(u32).range(0..=100))]
    deallocate_pct: Option<u32>,
    /// I/O size, e.g. 4KiB
    #[arg(long, value_name = "SIZE", value_parser = size_arg)]
    bs: Option<u64>,
    /// The lmcache-* workloads' metadata region before the first slot
    /// (LMCache's storage plugin: 128MiB, its multi-process L2 adapter: 256MiB)
    /// [default: 128MiB]
    #[arg(long, value_name = "SIZE", value_parser = size_arg)]
    lmcache_metadata: Option<u64>,
    /// Commands in flight per queue (1..=4095)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=4095))]
    qd: Option<u16>,
    /// NVMe/TCP I/O queues (connections) per controller
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    queues: Option<u16>,
    /// Controllers (as many hosts), each with --queues I/O queues [default: 1]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    controllers: Option<u16>,
    /// Measured seconds (fractions allowed)
    #[arg(long, value_name = "S", value_parser = positive_seconds)]
    time: Option<Duration>,
    /// Seconds of warm-up before measuring
    #[arg(long, value_name = "S", value_parser = seconds)]
    warmup: Option<Duration>,
    /// Pin workers to these CPUs, one thread each, e.g. 1 or 1,2
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    cpus: Option<Vec<usize>>,
    /// Check every read against what this run wrote
    #[arg(long)]
    verify: bool,
    /// Spin on the sockets (busy) or sleep in poll(2) (sleep) [default: busy]
    #[arg(long, value_enum)]
    poll: Option<Poll>,
    /// Header and data digests
    #[arg(long)]
    digests: bool,
    /// KV commands on a KV namespace: writes are Stores of one --bs value,
    /// reads Retrieves, --deallocate-pct Deletes; Retrieves that find no key
    /// are counted as misses (read-only runs store every key first)
    #[arg(long)]
    kv: bool,
    /// --kv: keys addressed [default: as many values as the namespace holds];
    /// more than that is eviction pressure
    #[arg(long, value_name = "N", requires = "kv", value_parser = clap::value_parser!(u64).range(1..))]
    kv_keys: Option<u64>,
    /// Random I/Os pick keys (or blocks) by Zipf popularity with this
    /// exponent, e.g. 0.99 [default: 0, uniform]
    #[arg(long, value_name = "THETA")]
    zipf: Option<f64>,
    /// Connect every queue, then send nothing until --time ends (what idle
    /// connections cost)
    #[arg(long)]
    idle: bool,
    /// Print the report as JSON
    #[arg(long)]
    json: bool,
    /// No progress line
    #[arg(long)]
    quiet: bool,
    /// Same-run baseline instead: plain loopback TCP with the workload's byte
    /// volume, no NVMe processing (needs no target)
    #[arg(long)]
    echo_baseline: bool,
    /// CPU of the baseline's echo server (implies --echo-baseline)
    #[arg(long, value_name = "N")]
    server_cpu: Option<usize>,
}

#[derive(Clone, Copy, ValueEnum)]
enum Poll {
    Busy,
    Sleep,
}

#[derive(Subcommand)]
enum NvmeCommand {
    /// List NVMe controllers and their drivers
    List,
    /// Bind controllers to vfio-pci
    Bind {
        #[arg(value_name = "PCI", required = true)]
        pci: Vec<String>,
    },
    /// Give controllers back to the kernel nvme driver
    Unbind {
        #[arg(value_name = "PCI", required = true)]
        pci: Vec<String>,
    },
}

#[derive(Subcommand)]
enum PoolCommand {
    /// Format a file or block device as a pool
    Create {
        path: PathBuf,
        /// Size of a file to create [default: the existing file's or device's]
        #[arg(long, value_parser = size_arg)]
        size: Option<u64>,
        /// Extent size, a power of two from 64KiB to 64MiB
        #[arg(long, value_parser = size_arg, default_value = "1MiB")]
        extent_size: u64,
        /// Format even when it already holds a pool
        #[arg(long)]
        force: bool,
        /// Volumes the pool's metadata has room for, 1 to 4096 (640 bytes each)
        #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..=4096))]
        max_volumes: u32,
    },
    /// Extents, journal and volumes of a pool
    Info { path: PathBuf },
}

#[derive(Subcommand)]
enum VolumeCommand {
    /// Volumes with size, used bytes and UUID
    List { path: PathBuf },
    /// Create a thin volume
    Create {
        path: PathBuf,
        name: String,
        #[arg(long, value_parser = size_arg)]
        size: u64,
        #[arg(long, value_parser = block_size, default_value = "4096")]
        block_size: u32,
        /// What reads of unwritten blocks return
        #[arg(long, value_enum, default_value = "zeroes")]
        unwritten: UnwrittenArg,
    },
    /// Change a volume's size
    Resize {
        path: PathBuf,
        name: String,
        #[arg(long, value_parser = size_arg)]
        size: u64,
    },
    /// Delete a volume and free its extents
    Delete { path: PathBuf, name: String },
}

#[derive(Clone, Copy, ValueEnum)]
enum UnwrittenArg {
    Zeroes,
    Error,
}

fn size_arg(s: &str) -> Result<u64, kvtarget::config::SizeError> {
    parse_size(s)
}

fn block_size(s: &str) -> Result<u32, String> {
    match s {
        "512" => Ok(512),
        "4096" => Ok(4096),
        _ => Err(format!("`{s}` is not 512 or 4096")),
    }
}

fn workload(s: &str) -> Result<kvtarget::perf::Workload, String> {
    s.parse()
        .map_err(|e: kvtarget::perf::PerfError| e.to_string())
}

fn seconds(s: &str) -> Result<Duration, String> {
    s.parse::<f64>()
        .ok()
        .and_then(|v| Duration::try_from_secs_f64(v).ok())
        .ok_or_else(|| format!("`{s}` is not a duration in seconds"))
}

fn positive_seconds(s: &str) -> Result<Duration, String> {
    match seconds(s)? {
        d if d.is_zero() => Err("must be positive".into()),
        d => Ok(d),
    }
}

/// Usage errors exit 2, except under `pool`, `volume` and `nvme`, whose errors of
/// every kind have always exited 1; scripts may rely on either.
fn usage_exit_code(args: &[OsString]) -> u8 {
    match args.get(1).and_then(|a| a.to_str()) {
        Some("pool" | "volume" | "nvme") => 1,
        _ => EXIT_USAGE,
    }
}

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    let parsed = Cli::command()
        .version(kvtarget::version())
        .try_get_matches_from(&args)
        .and_then(|m| Cli::from_arg_matches(&m));
    let cli = match parsed {
        Ok(c) => c,
        Err(e) => {
            // --help and --version come here too, for stdout and exit 0.
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(usage_exit_code(&args))
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match cli.command {
        None => run(cli.config, cli.log, cli.rpc_socket),
        Some(Command::CheckConfig { file }) => match Config::load(&file) {
            Ok(_) => {
                println!("{}: ok", file.display());
                ExitCode::SUCCESS
            }
            Err(e) => config_error(&e),
        },
        Some(Command::Check { pool }) => check(&pool),
        Some(Command::Rpc(a)) => rpc_cli(a),
        Some(Command::Perf(a)) => perf(a),
        Some(Command::Nvme(c)) => report(nvme(c)),
        Some(Command::Pool(c)) => report(tools::pool(c)),
        Some(Command::Volume(c)) => report(tools::volume(c)),
        Some(Command::Cluster(ClusterCommand::Status { socket, json })) => {
            cluster_status(&kvtarget::systemd::client_socket(&socket), json)
        }
        Some(Command::Top(a)) => top(a),
        Some(Command::Man { out }) => man_pages(&out),
    }
}

/// A usage error found after parsing, in clap's format.
fn usage_error(msg: impl std::fmt::Display) -> ExitCode {
    let _ = Cli::command()
        .error(ErrorKind::ValueValidation, msg)
        .print();
    ExitCode::from(EXIT_USAGE)
}

fn config_error(e: &kvtarget::config::ConfigError) -> ExitCode {
    eprintln!("kvtarget: config error: {e}");
    ExitCode::from(EXIT_CONFIG)
}

fn report(r: Result<(), ToolError>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kvtarget: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Errors of the offline tools; each prints as one line.
#[derive(Debug, thiserror::Error)]
enum ToolError {
    #[error("{}: no such file or device", .0.display())]
    NoDevice(PathBuf),
    #[error("{}: {source}", path.display())]
    Open {
        path: PathBuf,
        source: kvtarget::bdev::uring::OpenError,
    },
    #[error(transparent)]
    Pool(#[from] kvtarget::pool::PoolError),
    /// sysfs and driver errors of `nvme`.
    #[error(transparent)]
    Pci(#[from] kvtarget::bdev::nvme::NvmeError),
}

fn run(config: Option<PathBuf>, log: Option<String>, rpc_socket: Option<PathBuf>) -> ExitCode {
    let Some(path) = config else {
        return usage_error("--config is required");
    };
    let log = log
        .or_else(|| std::env::var("RUST_LOG").ok())
        .unwrap_or_else(|| "info".into());
    // Configuration errors come first: nothing is opened before it is all valid.
    let mut cfg = match Config::load(&path) {
        Ok(c) => c,
        Err(e) => return config_error(&e),
    };
    // The daemon always has a control socket unless the config turns it off.
    let rpc = cfg.rpc.get_or_insert_with(Default::default);
    if let Some(p) = rpc_socket {
        rpc.socket = p;
    }
    let filter = match tracing_subscriber::EnvFilter::try_new(&log) {
        Ok(f) => f,
        Err(e) => return usage_error(format!("bad --log filter `{log}`: {e}")),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();

    // Block the stop signals in every thread; the main thread waits for them.
    let signals = match kvtarget::reactor::signals::StopSignals::block() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("kvtarget: cannot set up signal handling: {e}");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(
        "kvtarget {} starting with {}",
        kvtarget::version(),
        path.display()
    );
    let mut service = kvtarget::systemd::Service::from_env();
    service.status("starting: recovering pools, binding listeners");
    let server = match Server::start(&cfg) {
        Ok(s) => s,
        // etcd unreachable or the node's name taken: the configuration
        // cannot work here, like a configuration error.
        Err(e @ kvtarget::server::StartError::Cluster(_)) => {
            eprintln!("kvtarget: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
        Err(e) => {
            eprintln!("kvtarget: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Listeners bound, pools recovered: a host's first connect succeeds now.
    service.ready(&server);
    let sig = signals.wait();
    tracing::info!("received {sig}; shutting down (completing in-flight I/O, syncing)");
    service.stopping();
    server.shutdown();
    // Controllers of the nvme backend get a normal shutdown even if a reference
    // outlived the server, so the kernel driver can take them back.
    kvtarget::bdev::nvme::shutdown_all();
    // SPDK's environment goes last, after every SPDK controller has detached.
    kvtarget::bdev::spdk::shutdown();
    tracing::info!("stopped");
    ExitCode::SUCCESS
}

fn rpc_cli(a: RpcArgs) -> ExitCode {
    use kvtarget::rpc::RpcClient;
    use serde_json::{Map, Value};
    let RpcArgs {
        socket,
        json: json_out,
        method,
        params,
    } = a;
    // Parameters: one JSON object, or key=value pairs whose values are JSON
    // when they parse as JSON and strings otherwise; a dotted key nests.
    let params: Value = match params.as_slice() {
        [one] if one.trim_start().starts_with('{') => match serde_json::from_str(one) {
            Ok(v) => v,
            Err(e) => return usage_error(format!("rpc: params are not JSON: {e}")),
        },
        _ => {
            let mut m = Map::new();
            for kv in &params {
                let Some((k, v)) = kv.split_once('=') else {
                    return usage_error(format!("rpc: `{kv}` is not key=value"));
                };
                let val = serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.to_string()));
                match k.split_once('.') {
                    Some((outer, inner)) => {
                        let e = m
                            .entry(outer.to_string())
                            .or_insert_with(|| Value::Object(Map::new()));
                        if let Value::Object(o) = e {
                            o.insert(inner.to_string(), val);
                        }
                    }
                    None => {
                        m.insert(k.to_string(), val);
                    }
                }
            }
            Value::Object(m)
        }
    };
    let mut client = match RpcClient::connect(&kvtarget::systemd::client_socket(&socket)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("kvtarget rpc: {e} (is the target running? -r sets the socket)");
            return ExitCode::from(2);
        }
    };
    match client.call(&method, params) {
        Ok(v) => {
            if json_out {
                out(&serde_json::to_string_pretty(&v).unwrap_or_default());
            } else {
                print_table(&v);
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kvtarget rpc: {method}: error {}: {}", e.code, e.message);
            ExitCode::FAILURE
        }
    }
}

/// `kvtarget top`: exit 2 when the target cannot be reached (as `rpc`), 1 on
/// any other error.
fn top(a: TopArgs) -> ExitCode {
    let opts = top::TopOptions {
        socket: kvtarget::systemd::client_socket(&a.socket),
        interval: a.delay,
        once: a.once,
    };
    match top::run(&opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ top::TopError::Connect(_)) => {
            eprintln!("kvtarget top: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("kvtarget top: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `kvtarget man --out DIR`: kvtarget.1 and kvtarget-SUBCOMMAND.1 (nested
/// subcommands too, e.g. kvtarget-pool-create.1), from the same clap
/// definitions as --help.
fn man_pages(dir: &std::path::Path) -> ExitCode {
    fn write_page(dir: &std::path::Path, cmd: clap::Command, name: String) -> std::io::Result<()> {
        let cmd = cmd.name(name.clone());
        let mut page = Vec::new();
        clap_mangen::Man::new(cmd.clone()).render(&mut page)?;
        std::fs::write(dir.join(format!("{name}.1")), page)?;
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            write_page(dir, sub.clone(), format!("{name}-{}", sub.get_name()))?;
        }
        Ok(())
    }
    let cmd = Cli::command().version(kvtarget::version());
    let written =
        std::fs::create_dir_all(dir).and_then(|()| write_page(dir, cmd, "kvtarget".into()));
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kvtarget man: {}: {e}", dir.display());
            ExitCode::FAILURE
        }
    }
}

/// `kvtarget cluster status`: `kvtarget_get_cluster` as a table or JSON.
fn cluster_status(socket: &std::path::Path, json: bool) -> ExitCode {
    let mut client = match kvtarget::rpc::RpcClient::connect(socket) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("kvtarget cluster: {e} (is the target running? -r sets the socket)");
            return ExitCode::from(2);
        }
    };
    let v = match client.call("kvtarget_get_cluster", serde_json::json!({})) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("kvtarget cluster: {}", e.message);
            return ExitCode::FAILURE;
        }
    };
    if json {
        out(&serde_json::to_string_pretty(&v).unwrap_or_default());
        return ExitCode::SUCCESS;
    }
    match serde_json::from_value::<kvtarget::cluster::ClusterStatus>(v) {
        Ok(s) => {
            out(&kvtarget::cluster::status_table(&s));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kvtarget cluster: unexpected answer: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Human output: arrays of objects as a table of their scalar fields; other
/// values as indented JSON.
fn print_table(v: &serde_json::Value) {
    use serde_json::Value;
    let scalar = |x: &Value| match x {
        Value::String(s) => s.clone(),
        Value::Array(a) => a
            .iter()
            .map(|e| match e {
                Value::String(s) => s.clone(),
                Value::Object(o) => o
                    .get("nqn")
                    .or_else(|| o.get("traddr"))
                    .or_else(|| o.get("nsid"))
                    .map(|v| v.to_string().trim_matches('"').to_string())
                    .unwrap_or_else(|| "{..}".into()),
                other => other.to_string(),
            })
            .collect::<Vec<_>>()
            .join(","),
        Value::Object(_) => "{..}".into(),
        other => other.to_string(),
    };
    match v {
        Value::Array(rows) if rows.iter().all(Value::is_object) && !rows.is_empty() => {
            let mut cols: Vec<String> = Vec::new();
            for r in rows {
                if let Value::Object(o) = r {
                    for k in o.keys() {
                        if !cols.contains(k) {
                            cols.push(k.clone());
                        }
                    }
                }
            }
            let cells: Vec<Vec<String>> = rows
                .iter()
                .map(|r| {
                    cols.iter()
                        .map(|c| r.get(c).map(scalar).unwrap_or_default())
                        .collect()
                })
                .collect();
            let widths: Vec<usize> = cols
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    cells
                        .iter()
                        .map(|r| r[i].chars().count())
                        .max()
                        .unwrap_or(0)
                        .max(c.len())
                        .min(60)
                })
                .collect();
            let line = |r: &[String]| {
                r.iter()
                    .zip(&widths)
                    .map(|(c, w)| {
                        // At most 60 characters (never a cut inside one).
                        let c: String = c.chars().take(60).collect();
                        format!("{c:<w$}", w = *w)
                    })
                    .collect::<Vec<_>>()
                    .join("  ")
            };
            out(&line(&cols));
            for r in &cells {
                out(&line(r));
            }
        }
        Value::Bool(true) => out("ok"),
        other => out(&serde_json::to_string_pretty(other).unwrap_or_default()),
    }
}

/// One line of `kvtarget rpc`'s answer on stdout. A reader that went away
/// (`kvtarget rpc ... | head`) ends the output, not the process with a panic.
fn out(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}

fn check(path: &std::path::Path) -> ExitCode {
    let opened = tools::open_existing(path).and_then(|d| {
        kvtarget::pool::lock_pool(path, false)
            .map(|l| (d, l))
            .map_err(ToolError::Pool)
    });
    let (dev, _lock) = match opened {
        Ok(x) => x,
        Err(e) => {
            eprintln!("kvtarget check: {e}");
            return ExitCode::from(2);
        }
    };
    let rep = kvtarget::pool::check(&dev);
    for l in &rep.lines {
        println!("{l}");
    }
    let path = path.display();
    if rep.damage.is_empty() {
        println!("{path}: pool is consistent");
        ExitCode::SUCCESS
    } else {
        for d in &rep.damage {
            println!("DAMAGE: {d}");
        }
        println!("{path}: pool is damaged ({} problems)", rep.damage.len());
        ExitCode::from(1)
    }
}

fn nvme(c: NvmeCommand) -> Result<(), ToolError> {
    use kvtarget::bdev::nvme::pci;
    let bdfs = |v: &[String]| -> Result<Vec<String>, ToolError> {
        v.iter()
            .map(|a| pci::parse_bdf(a).map_err(ToolError::Pci))
            .collect()
    };
    match c {
        NvmeCommand::List => {
            for (bdf, drv) in pci::list() {
                println!("{bdf} {}", drv.as_deref().unwrap_or("-"));
            }
        }
        NvmeCommand::Bind { pci: v } => {
            for b in bdfs(&v)? {
                pci::bind_vfio(&b).map_err(ToolError::Pci)?;
                println!("{b} vfio-pci");
            }
        }
        NvmeCommand::Unbind { pci: v } => {
            for b in bdfs(&v)? {
                pci::unbind_vfio(&b).map_err(ToolError::Pci)?;
                println!("{b} nvme");
            }
        }
    }
    Ok(())
}

mod tools {
    use super::{PoolCommand, ToolError, UnwrittenArg, VolumeCommand};
    use kvtarget::bdev::uring::UringDevice;
    use kvtarget::bdev::SharedDevice;
    use kvtarget::pool::format::VOL_UNWRITTEN_ERROR;
    use kvtarget::pool::{format, FormatOptions, Pool, PoolOptions};
    use std::path::Path;
    use std::sync::Arc;

    /// Opens an existing pool file or block device without creating anything.
    pub fn open_existing(path: &Path) -> Result<SharedDevice, ToolError> {
        if !path.exists() {
            return Err(ToolError::NoDevice(path.into()));
        }
        open_device(path, None)
    }

    fn open_device(path: &Path, size: Option<u64>) -> Result<SharedDevice, ToolError> {
        Ok(
            UringDevice::open(path, size, 512).map_err(|source| ToolError::Open {
                path: path.into(),
                source,
            })?,
        )
    }

    fn open_pool(path: &Path) -> Result<(Arc<Pool>, kvtarget::pool::PoolLock), ToolError> {
        let dev = open_existing(path)?;
        let lock = kvtarget::pool::lock_pool(path, true)?;
        Ok((Pool::open("offline", dev, PoolOptions::default())?, lock))
    }

    /// Runs `op` on the open pool and closes it either way; the operation's
    /// error wins over the close's.
    fn with_pool(
        path: &Path,
        op: impl FnOnce(&Pool) -> Result<(), kvtarget::pool::PoolError>,
    ) -> Result<(), ToolError> {
        let (pool, _lock) = open_pool(path)?;
        let r = op(&pool);
        let c = pool.close();
        r?;
        c?;
        Ok(())
    }

    pub fn pool(c: PoolCommand) -> Result<(), ToolError> {
        match c {
            PoolCommand::Create {
                path,
                size,
                extent_size,
                force,
                max_volumes,
            } => {
                let dev = open_device(&path, size)?;
                let _lock = kvtarget::pool::lock_pool(&path, true)?;
                let sb = format(
                    &dev,
                    &FormatOptions {
                        extent_size,
                        force,
                        journal_len: None,
                        max_volumes: Some(max_volumes),
                    },
                )?;
                println!(
                    "{}: pool created: {} extents of {} bytes, {} bytes of metadata",
                    path.display(),
                    sb.extent_count,
                    sb.extent_size,
                    sb.data_offset
                );
                Ok(())
            }
            PoolCommand::Info { path } => with_pool(&path, |pool| {
                let s = pool.snapshot();
                println!(
                    "extents: {} x {} bytes; mapped {}, clean {}, dirty {}",
                    s.extents, s.extent_size, s.mapped, s.clean, s.dirty
                );
                println!(
                    "journal: {} of {} bytes used",
                    s.journal_used, s.journal_len
                );
                println!(
                    "volumes: {} of at most {} (superblock format {})",
                    pool.volumes().len(),
                    pool.sb.max_volumes,
                    pool.sb.version
                );
                list(pool);
                Ok(())
            }),
        }
    }

    pub fn volume(c: VolumeCommand) -> Result<(), ToolError> {
        match c {
            VolumeCommand::List { path } => with_pool(&path, |pool| {
                list(pool);
                Ok(())
            }),
            VolumeCommand::Create {
                path,
                name,
                size,
                block_size,
                unwritten,
            } => {
                let flags = match unwritten {
                    UnwrittenArg::Zeroes => 0,
                    UnwrittenArg::Error => VOL_UNWRITTEN_ERROR,
                };
                with_pool(&path, |pool| {
                    pool.create_volume(&name, size, block_size, flags).map(drop)
                })?;
                println!("volume {name} created ({size} bytes)");
                Ok(())
            }
            VolumeCommand::Resize { path, name, size } => {
                with_pool(&path, |pool| pool.resize_volume(&name, size).map(drop))?;
                println!("volume {name} resized to {size} bytes");
                Ok(())
            }
            VolumeCommand::Delete { path, name } => {
                with_pool(&path, |pool| pool.delete_volume(&name).map(drop))?;
                println!("volume {name} deleted");
                Ok(())
            }
        }
    }

    fn list(pool: &Pool) {
        for v in pool.volumes() {
            let d = &v.desc;
            println!(
                "volume {:<20} size {:>14} block {:>4} used {:>14} unwritten {} uuid {}",
                d.name,
                d.size_bytes,
                d.block_size,
                v.used_bytes(),
                if d.flags & VOL_UNWRITTEN_ERROR != 0 {
                    "error "
                } else {
                    "zeroes"
                },
                d.uuid
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<String>()
            );
        }
    }
}

fn perf(a: PerfArgs) -> ExitCode {
    let json = a.json;
    // --server-cpu alone means the baseline too.
    let echo = (a.echo_baseline || a.server_cpu.is_some()).then_some(a.server_cpu);
    let opts = perf_options(a);
    match run_perf_or_echo(&opts, echo) {
        Ok(r) => {
            if json {
                println!("{}", r.to_json());
            } else {
                println!(
                    "{:?} bs {} qd {} queues {} for {:?}: {}",
                    opts.workload,
                    opts.block_size,
                    opts.qd,
                    opts.queues as u32 * opts.controllers as u32,
                    opts.runtime,
                    r.to_text()
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kvtarget perf: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The options clap checked, over PerfOptions' defaults.
fn perf_options(a: PerfArgs) -> kvtarget::perf::PerfOptions {
    // The baseline needs no target; the address is then unused.
    let addr = a.addr.unwrap_or(SocketAddr::from(([127, 0, 0, 1], 4420)));
    let mut o = kvtarget::perf::PerfOptions::new(addr, a.nqn.as_deref().unwrap_or(""));
    o.progress = !a.quiet;
    o.hostnqn = a.hostnqn;
    o.verify = a.verify;
    o.idle = a.idle;
    o.kv = a.kv;
    o.kv_keys = a.kv_keys;
    if let Some(z) = a.zipf {
        o.zipf = z;
    }
    if a.digests {
        o.digests = kvtarget::wire::tcp::Digests {
            header: true,
            data: true,
        };
    }
    if let Some(v) = a.nsid {
        o.nsid = v;
    }
    if let Some(v) = a.workload {
        o.workload = v;
    }
    if let Some(v) = a.rwmix_read {
        o.read_pct = v;
    }
    if let Some(v) = a.deallocate_pct {
        o.deallocate_pct = v;
    }
    if let Some(v) = a.bs {
        o.block_size = v as usize;
    }
    if let Some(v) = a.lmcache_metadata {
        o.lmcache_metadata = v;
    }
    if let Some(v) = a.qd {
        o.qd = v as usize;
    }
    if let Some(v) = a.queues {
        o.queues = v;
    }
    if let Some(v) = a.controllers {
        o.controllers = v;
    }
    if let Some(v) = a.time {
        o.runtime = v;
    }
    if let Some(v) = a.warmup {
        o.warmup = v;
    }
    if let Some(v) = a.cpus {
        o.cpus = v;
    }
    if let Some(p) = a.poll {
        o.busy_poll = matches!(p, Poll::Busy);
    }
    o
}

/// With `--echo-baseline` (`echo` is Some(server CPU)), runs the plain loopback
/// TCP exchange with this workload's byte volume instead of the workload.
fn run_perf_or_echo(
    o: &kvtarget::perf::PerfOptions,
    echo: Option<Option<usize>>,
) -> Result<kvtarget::perf::PerfReport, kvtarget::perf::PerfError> {
    use kvtarget::perf::{echo, Workload};
    let Some(server_cpu) = echo else {
        return kvtarget::perf::run(o);
    };
    let icd = 8192;
    let (rq, rs) = echo::EchoOptions::for_io(true, o.block_size, icd);
    let (wq, ws) = echo::EchoOptions::for_io(false, o.block_size, icd);
    let pct = match o.workload {
        Workload::RandRead
        | Workload::Read
        | Workload::LmcacheRetrieve
        | Workload::List
        | Workload::Exist => 100,
        Workload::RandWrite | Workload::Write | Workload::LmcacheStore => 0,
        Workload::RandRw => o.read_pct as usize,
    };
    let mix = |r: usize, w: usize| (r * pct + w * (100 - pct)) / 100;
    echo::run(&echo::EchoOptions {
        request: mix(rq, wq),
        response: mix(rs, ws),
        qd: o.qd * o.queues as usize,
        runtime: o.runtime,
        warmup: o.warmup,
        server_cpu,
        client_cpu: o.cpus.first().copied(),
    })
}
