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
    kvtarget --version

OPTIONS:
    -c, --config <FILE>   configuration file (see config/default.toml)
    -l, --log <FILTER>    log filter, e.g. info, debug, kvtarget=trace (default: info, or RUST_LOG)
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut config: Option<PathBuf> = None;
    let mut log = std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into());
    let mut check_only = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-c" | "--config" => match it.next() {
                Some(p) => config = Some(PathBuf::from(p)),
                None => return usage_error("--config needs a file"),
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
    let cfg = match Config::load(&path) {
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
    tracing::info!("stopped");
    ExitCode::SUCCESS
}

fn usage_error(msg: &str) -> ExitCode {
    eprintln!("kvtarget: {msg}\n\n{USAGE}");
    ExitCode::from(2)
}
