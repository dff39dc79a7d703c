//! AFL entry point; the harness is `kvtarget_fuzz::pool_check` so tests can replay it.
fn main() {
    afl::fuzz!(|data: &[u8]| kvtarget_fuzz::pool_check(data));
}
