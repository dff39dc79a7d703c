//! AFL entry point; the harness is `kvtarget_fuzz::etcd_answer` so tests can replay it.
fn main() {
    afl::fuzz!(|data: &[u8]| kvtarget_fuzz::etcd_answer(data));
}
