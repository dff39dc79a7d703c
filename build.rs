//! Records the git commit the binary was built from (shown by `kvtarget --version`
//! and used as the firmware revision in Identify Controller), and with the `spdk`
//! feature links kvtarget's binaries and tests against SPDK the way `spdk-sys`
//! worked out (its `links` metadata: `rustc-link-arg` from a dependency does not
//! reach this package's targets).
use std::process::Command;

fn main() {
    println!("cargo::rerun-if-changed=.git/HEAD");
    println!("cargo::rerun-if-changed=.git/refs");
    println!("cargo::rerun-if-env-changed=DEP_SPDK_LINK_ARGS");
    let rev = Command::new("git")
        .args(["rev-parse", "--short=8", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    println!("cargo::rustc-env=KVTARGET_GIT_REV={rev}");
    if std::env::var_os("CARGO_FEATURE_SPDK").is_some() {
        if let Ok(args) = std::env::var("DEP_SPDK_LINK_ARGS") {
            for a in args.split("\\n").filter(|a| !a.is_empty()) {
                println!("cargo::rustc-link-arg={a}");
            }
        }
    }
}
