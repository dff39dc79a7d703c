//! AFL entry point; the harness is `kvtarget_fuzz::auth` so tests can replay it.
fn main() {
    afl::fuzz!(|data: &[u8]| kvtarget_fuzz::auth(data));
}
