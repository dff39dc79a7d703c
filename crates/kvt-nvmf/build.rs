//! Records the git commit the build comes from (`KVTARGET_GIT_REV`): the
//! firmware revision in Identify Controller, and `version()`.
//!
//! The build reruns when HEAD or the branch it names moves, found with git
//! itself because a worktree's `.git` is a file: naming `.git/HEAD` there
//! names nothing, and cargo then reruns this and rebuilds every crate above
//! at every build.
use std::path::PathBuf;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    Command::new("git")
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Asks cargo to rerun when git's file `name` (HEAD, a ref, packed-refs)
/// changes, if it exists: a missing file would rerun every build.
fn watch(name: &str) {
    let Some(path) = git(&["rev-parse", "--git-path", name]) else {
        return;
    };
    let path = PathBuf::from(path);
    if let Ok(path) = path.canonicalize() {
        println!("cargo::rerun-if-changed={}", path.display());
    }
}

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    watch("HEAD");
    watch("packed-refs");
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watch(&branch);
    }
    let rev = git(&["rev-parse", "--short=8", "HEAD"]).unwrap_or_default();
    println!("cargo::rustc-env=KVTARGET_GIT_REV={rev}");
}
