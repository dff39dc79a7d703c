//! The kvtarget daemon.

use kvtarget::config::Config;
use kvtarget::server::Server;
use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "\
kvtarget: NVMe-over-Fabrics target for KV-cache volumes

USAGE:
    kvtarget --config <FILE>      run the target (SIGINT/SIGTERM stop it cleanly)
    kvtarget check-config <FILE>  validate a configuration and exit
    kvtarget perf --addr A:P --nqn NQN [--workload W] [--bs N] [--qd N] [--queues N]
                  [--time S] [--warmup S] [--rwmix-read PCT] [--nsid N] [--hostnqn NQN]
                  [--deallocate-pct PCT] [--cpus LIST] [--verify] [--poll busy|sleep]
                  [--digests] [--json] [--quiet]
                                  NVMe/TCP load generator (spdk_nvme_perf-like):
                                  W = randread|randwrite|randrw|read|write; queues
                                  spread over one pinned thread per --cpus entry;
                                  --verify checks every read against this run's
                                  writes; --deallocate-pct turns that share of
                                  writes into deallocates (churn for thin volumes);
                                  a progress line goes to stderr each second
    kvtarget perf --echo-baseline [--server-cpu N] [--workload W] [--bs N] [--qd N]
                  [--cpus LIST] [--time S] [--warmup S] [--json]
                                  same-run baseline: plain loopback TCP with the
                                  workload's byte volume, no NVMe processing
    kvtarget check <POOL>         verify a pool offline (file or block device);
                                  exits 1 with a report when it is damaged
    kvtarget pool create <PATH> [--size S] [--extent-size S] [--force]
    kvtarget pool info <PATH>
    kvtarget volume list <PATH>
    kvtarget volume create <PATH> <NAME> --size S [--block-size 512|4096]
                  [--unwritten zeroes|error]
    kvtarget volume resize <PATH> <NAME> --size S
    kvtarget volume delete <PATH> <NAME>
                                  offline pool and volume management (the target
                                  must not be running on that pool)
    kvtarget rpc [-r SOCKET] [--json] <METHOD> [JSON-PARAMS | key=value ...]
                                  call a JSON-RPC method (SPDK names, e.g.
                                  nvmf_get_subsystems, nvmf_subsystem_add_ns,
                                  bdev_lvol_create; rpc_get_methods lists them)
    kvtarget nvme list | bind <PCI>... | unbind <PCI>...
                                  hand the named NVMe controllers to vfio-pci
                                  (for the nvme backend) or back to the kernel
    kvtarget --version

OPTIONS:
    -c, --config <FILE>   configuration file (see config/default.toml)
    -l, --log <FILTER>    log filter, e.g. info, debug, kvtarget=trace (default: info, or RUST_LOG)
    -r, --rpc-socket <P>  JSON-RPC socket (default: [rpc] socket, else /var/tmp/kvtarget.sock)
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("perf") => return perf(&args[1..]),
        Some("check") => return check(&args[1..]),
        Some("rpc") => return rpc_cli(&args[1..]),
        Some("nvme") => {
            return match kvtarget::bdev::nvme::pci::command(&args[1..]) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("kvtarget: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Some("pool") | Some("volume") => {
            return match tools::run(&args) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("kvtarget: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        _ => {}
    }
    let mut config: Option<PathBuf> = None;
    let mut log = std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into());
    let mut check_only = false;
    let mut rpc_socket: Option<PathBuf> = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-c" | "--config" => match it.next() {
                Some(p) => config = Some(PathBuf::from(p)),
                None => return usage_error("--config needs a file"),
            },
            "-r" | "--rpc-socket" => match it.next() {
                Some(p) => rpc_socket = Some(PathBuf::from(p)),
                None => return usage_error("--rpc-socket needs a path"),
            },
            "-l" | "--log" => match it.next() {
                Some(f) => log = f.clone(),
                None => return usage_error("--log needs a filter"),
            },
            "check-config" => match it.next() {
                Some(p) => {
                    config = Some(PathBuf::from(p));
                    check_only = true;
                }
                None => return usage_error("check-config needs a file"),
            },
            "-V" | "--version" => {
                println!("kvtarget {}", kvtarget::version());
                return ExitCode::SUCCESS;
            }
            "-h" | "--help" => {
                print!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            other => return usage_error(&format!("unknown argument `{other}`")),
        }
    }
    let Some(path) = config else {
        return usage_error("--config is required");
    };
    let mut cfg = match Config::load(&path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("kvtarget: config error: {e}");
            return ExitCode::from(2);
        }
    };
    if check_only {
        println!("{}: ok", path.display());
        return ExitCode::SUCCESS;
    }
    // The daemon always has a control socket unless the config turns it off.
    let rpc = cfg.rpc.get_or_insert_with(Default::default);
    if let Some(p) = rpc_socket {
        rpc.socket = p;
    }
    let filter = match tracing_subscriber::EnvFilter::try_new(&log) {
        Ok(f) => f,
        Err(e) => return usage_error(&format!("bad --log filter `{log}`: {e}")),
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
    let server = match Server::start(&cfg) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("kvtarget: {e}");
            return ExitCode::FAILURE;
        }
    };
    let sig = signals.wait();
    tracing::info!("received {sig}; shutting down (completing in-flight I/O, syncing)");
    server.shutdown();
    // Controllers of the nvme backend get a normal shutdown even if a reference
    // outlived the server, so the kernel driver can take them back.
    kvtarget::bdev::nvme::shutdown_all();
    // SPDK's environment goes last, after every SPDK controller has detached.
    kvtarget::bdev::spdk::shutdown();
    tracing::info!("stopped");
    ExitCode::SUCCESS
}

fn rpc_cli(args: &[String]) -> ExitCode {
    use kvtarget::rpc::RpcClient;
    use serde_json::{Map, Value};
    let mut socket = PathBuf::from(kvtarget::rpc::DEFAULT_SOCKET);
    let mut json_out = false;
    let mut rest = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-r" | "-s" | "--rpc-socket" => match it.next() {
                Some(p) => socket = PathBuf::from(p),
                None => return usage_error("rpc: -r needs a socket path"),
            },
            "--json" => json_out = true,
            _ => rest.push(a.clone()),
        }
    }
    let Some((method, params)) = rest.split_first() else {
        return usage_error("rpc needs a method name (try rpc_get_methods)");
    };
    // Parameters: one JSON object, or key=value pairs whose values are JSON
    // when they parse as JSON and strings otherwise; a dotted key nests.
    let params: Value = if params.len() == 1 && params[0].trim_start().starts_with('{') {
        match serde_json::from_str(&params[0]) {
            Ok(v) => v,
            Err(e) => return usage_error(&format!("rpc: params are not JSON: {e}")),
        }
    } else {
        let mut m = Map::new();
        for kv in params {
            let Some((k, v)) = kv.split_once('=') else {
                return usage_error(&format!("rpc: `{kv}` is not key=value"));
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
    };
    let mut client = match RpcClient::connect(&socket) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("kvtarget rpc: {e} (is the target running? -r sets the socket)");
            return ExitCode::from(2);
        }
    };
    match client.call(method, params) {
        Ok(v) => {
            if json_out {
                println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
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
                        .map(|r| r[i].len())
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
                        format!("{:<w$}", if c.len() > 60 { &c[..60] } else { c }, w = *w)
                    })
                    .collect::<Vec<_>>()
                    .join("  ")
            };
            println!("{}", line(&cols));
            for r in &cells {
                println!("{}", line(r));
            }
        }
        Value::Bool(true) => println!("ok"),
        other => println!(
            "{}",
            serde_json::to_string_pretty(other).unwrap_or_default()
        ),
    }
}

fn check(args: &[String]) -> ExitCode {
    let [path] = args else {
        return usage_error("check needs exactly one pool path");
    };
    let opened = tools::open_existing(path).and_then(|d| {
        kvtarget::pool::lock_pool(std::path::Path::new(path), false)
            .map(|l| (d, l))
            .map_err(String::from)
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

mod tools {
    use kvtarget::bdev::uring::UringDevice;
    use kvtarget::bdev::SharedDevice;
    use kvtarget::config::parse_size;
    use kvtarget::pool::format::VOL_UNWRITTEN_ERROR;
    use kvtarget::pool::{format, FormatOptions, Pool, PoolOptions};
    use std::path::Path;
    use std::sync::Arc;

    /// Opens an existing pool file or block device without creating anything.
    pub fn open_existing(path: &str) -> Result<SharedDevice, String> {
        if !Path::new(path).exists() {
            return Err(format!("{path}: no such file or device"));
        }
        Ok(UringDevice::open(Path::new(path), None, 512).map_err(|e| format!("{path}: {e}"))?)
    }

    fn flag<'a>(args: &'a [String], name: &str) -> Result<Option<&'a str>, String> {
        match args.iter().position(|a| a == name) {
            Some(i) => args
                .get(i + 1)
                .map(|v| Some(v.as_str()))
                .ok_or(format!("{name} needs a value")),
            None => Ok(None),
        }
    }

    fn positional(args: &[String]) -> Vec<&str> {
        let mut out = Vec::new();
        let mut skip = false;
        for a in args {
            if skip {
                skip = false;
            } else if a == "--force" {
            } else if a.starts_with("--") {
                skip = true;
            } else {
                out.push(a.as_str());
            }
        }
        out
    }

    fn known(args: &[String], flags: &[&str]) -> Result<(), String> {
        for a in args.iter().filter(|a| a.starts_with("--")) {
            if !flags.contains(&a.as_str()) {
                return Err(format!("unknown option `{a}`"));
            }
        }
        Ok(())
    }

    fn open_pool(path: &str) -> Result<(Arc<Pool>, kvtarget::pool::PoolLock), String> {
        let dev = open_existing(path)?;
        let lock = kvtarget::pool::lock_pool(Path::new(path), true)?;
        Ok((Pool::open("offline", dev, PoolOptions::default())?, lock))
    }

    pub fn run(args: &[String]) -> Result<(), String> {
        let what = format!(
            "{} {}",
            args[0],
            args.get(1).map(String::as_str).unwrap_or("")
        );
        let rest = &args[2.min(args.len())..];
        let pos = positional(rest);
        match what.trim() {
            "pool create" => {
                known(rest, &["--size", "--extent-size", "--force"])?;
                let [path] = pos[..] else {
                    return Err("pool create needs one path".into());
                };
                let size = flag(rest, "--size")?.map(parse_size).transpose()?;
                let extent_size = flag(rest, "--extent-size")?
                    .map(parse_size)
                    .transpose()?
                    .unwrap_or(1 << 20);
                let dev: SharedDevice = UringDevice::open(Path::new(path), size, 512)
                    .map_err(|e| format!("{path}: {e}"))?;
                let _lock = kvtarget::pool::lock_pool(Path::new(path), true)?;
                let sb = format(
                    &dev,
                    &FormatOptions {
                        extent_size,
                        force: rest.iter().any(|a| a == "--force"),
                        journal_len: None,
                    },
                )?;
                println!(
                    "{path}: pool created: {} extents of {} bytes, {} bytes of metadata",
                    sb.extent_count, sb.extent_size, sb.data_offset
                );
                Ok(())
            }
            "pool info" => {
                known(rest, &[])?;
                let [path] = pos[..] else {
                    return Err("pool info needs one path".into());
                };
                let (pool, _lock) = open_pool(path)?;
                let s = pool.snapshot();
                println!(
                    "extents: {} x {} bytes; mapped {}, clean {}, dirty {}",
                    s.extents, s.extent_size, s.mapped, s.clean, s.dirty
                );
                println!(
                    "journal: {} of {} bytes used",
                    s.journal_used, s.journal_len
                );
                list(&pool);
                pool.close().map_err(String::from)
            }
            "volume list" => {
                known(rest, &[])?;
                let [path] = pos[..] else {
                    return Err("volume list needs one path".into());
                };
                let (pool, _lock) = open_pool(path)?;
                list(&pool);
                pool.close().map_err(String::from)
            }
            "volume create" => {
                known(rest, &["--size", "--block-size", "--unwritten"])?;
                let [path, name] = pos[..] else {
                    return Err("volume create needs a pool path and a name".into());
                };
                let size = parse_size(flag(rest, "--size")?.ok_or("--size is required")?)?;
                let bs = match flag(rest, "--block-size")? {
                    None => 4096,
                    Some(v) => v
                        .parse()
                        .map_err(|_| format!("--block-size: `{v}` is not 512 or 4096"))?,
                };
                let flags = match flag(rest, "--unwritten")? {
                    None | Some("zeroes") => 0,
                    Some("error") => VOL_UNWRITTEN_ERROR,
                    Some(v) => return Err(format!("--unwritten: `{v}` is not zeroes or error")),
                };
                let (pool, _lock) = open_pool(path)?;
                let r = pool.create_volume(name, size, bs, flags);
                let c = pool.close();
                r?;
                c?;
                println!("volume {name} created ({size} bytes)");
                Ok(())
            }
            "volume resize" => {
                known(rest, &["--size"])?;
                let [path, name] = pos[..] else {
                    return Err("volume resize needs a pool path and a name".into());
                };
                let size = parse_size(flag(rest, "--size")?.ok_or("--size is required")?)?;
                let (pool, _lock) = open_pool(path)?;
                let r = pool.resize_volume(name, size);
                let c = pool.close();
                r?;
                c?;
                println!("volume {name} resized to {size} bytes");
                Ok(())
            }
            "volume delete" => {
                known(rest, &[])?;
                let [path, name] = pos[..] else {
                    return Err("volume delete needs a pool path and a name".into());
                };
                let (pool, _lock) = open_pool(path)?;
                let r = pool.delete_volume(name);
                let c = pool.close();
                r?;
                c?;
                println!("volume {name} deleted");
                Ok(())
            }
            other => Err(format!("unknown command `{other}` (see --help)")),
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

fn usage_error(msg: &str) -> ExitCode {
    eprintln!("kvtarget: {msg}\n\n{USAGE}");
    ExitCode::from(2)
}

fn perf(args: &[String]) -> ExitCode {
    match perf_options(args) {
        Ok((opts, json, echo)) => match run_perf_or_echo(&opts, echo) {
            Ok(r) => {
                if json {
                    println!("{}", r.to_json());
                } else {
                    println!(
                        "{:?} bs {} qd {} queues {} for {:?}: {}",
                        opts.workload,
                        opts.block_size,
                        opts.qd,
                        opts.queues,
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
        },
        Err(e) => usage_error(&format!("perf: {e}")),
    }
}

/// With `--echo-baseline` (`echo` is Some(server CPU)), runs the plain loopback
/// TCP exchange with this workload's byte volume instead of the workload.
fn run_perf_or_echo(
    o: &kvtarget::perf::PerfOptions,
    echo: Option<Option<usize>>,
) -> Result<kvtarget::perf::PerfReport, String> {
    use kvtarget::perf::{echo, Workload};
    let Some(server_cpu) = echo else {
        return kvtarget::perf::run(o);
    };
    let icd = 8192;
    let (rq, rs) = echo::EchoOptions::for_io(true, o.block_size, icd);
    let (wq, ws) = echo::EchoOptions::for_io(false, o.block_size, icd);
    let pct = match o.workload {
        Workload::RandRead | Workload::Read => 100,
        Workload::RandWrite | Workload::Write => 0,
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

type PerfArgs = (kvtarget::perf::PerfOptions, bool, Option<Option<usize>>);

fn perf_options(args: &[String]) -> Result<PerfArgs, String> {
    use std::time::Duration;
    let mut addr = None;
    let mut nqn = None;
    let mut o = kvtarget::perf::PerfOptions::new("127.0.0.1:4420".parse().map_err(|_| "addr")?, "");
    o.progress = true;
    let mut json = false;
    let mut echo = None;
    let mut it = args.iter();
    fn num<T: std::str::FromStr>(flag: &str, v: Option<&String>) -> Result<T, String> {
        let v = v.ok_or(format!("{flag} needs a value"))?;
        v.parse()
            .map_err(|_| format!("{flag}: `{v}` is not a number"))
    }
    fn secs(flag: &str, v: f64) -> Result<Duration, String> {
        Duration::try_from_secs_f64(v)
            .map_err(|_| format!("{flag}: `{v}` is not a duration in seconds"))
    }
    while let Some(a) = it.next() {
        match a.as_str() {
            "--addr" => {
                let v = it.next().ok_or("--addr needs ADDRESS:PORT")?;
                addr = Some(
                    v.parse()
                        .map_err(|_| format!("--addr: `{v}` is not ADDRESS:PORT"))?,
                );
            }
            "--nqn" => nqn = it.next().cloned(),
            "--hostnqn" => o.hostnqn = it.next().cloned(),
            "--nsid" => o.nsid = num("--nsid", it.next())?,
            "--workload" => o.workload = it.next().ok_or("--workload needs a value")?.parse()?,
            "--rwmix-read" => o.read_pct = num("--rwmix-read", it.next())?,
            "--deallocate-pct" => o.deallocate_pct = num("--deallocate-pct", it.next())?,
            "--bs" => {
                let v = it.next().ok_or("--bs needs a size")?;
                o.block_size =
                    kvtarget::config::parse_size(v).map_err(|e| format!("--bs: {e}"))? as usize;
            }
            "--qd" => o.qd = num("--qd", it.next())?,
            "--queues" => o.queues = num("--queues", it.next())?,
            "--time" => o.runtime = secs("--time", num("--time", it.next())?)?,
            "--warmup" => o.warmup = secs("--warmup", num("--warmup", it.next())?)?,
            "--digests" => {
                o.digests = kvtarget::wire::tcp::Digests {
                    header: true,
                    data: true,
                }
            }
            "--json" => json = true,
            "--verify" => o.verify = true,
            "--echo-baseline" => echo = Some(echo.flatten()),
            "--server-cpu" => echo = Some(Some(num("--server-cpu", it.next())?)),
            "--quiet" => o.progress = false,
            "--poll" => {
                o.busy_poll = match it.next().map(String::as_str) {
                    Some("busy") => true,
                    Some("sleep") => false,
                    _ => return Err("--poll: expected busy or sleep".into()),
                }
            }
            "--cpus" => {
                let v = it.next().ok_or("--cpus needs a list, e.g. 1 or 1,2")?;
                o.cpus = v
                    .split(',')
                    .map(|c| {
                        c.trim()
                            .parse::<usize>()
                            .map_err(|_| format!("--cpus: `{c}` is not a CPU number"))
                    })
                    .collect::<Result<_, _>>()?;
            }
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    if echo.is_some() {
        // The baseline needs no target.
        return Ok((o, json, echo));
    }
    o.addr = addr.ok_or("--addr is required")?;
    o.nqn = nqn.ok_or("--nqn is required")?;
    if o.qd == 0 || o.qd > 4095 {
        return Err("--qd must be 1..=4095".into());
    }
    if o.queues == 0 {
        return Err("--queues must be at least 1".into());
    }
    if o.read_pct > 100 {
        return Err("--rwmix-read must be 0..=100".into());
    }
    if o.deallocate_pct > 100 {
        return Err("--deallocate-pct must be 0..=100".into());
    }
    if o.runtime.is_zero() {
        return Err("--time must be positive".into());
    }
    Ok((o, json, echo))
}
