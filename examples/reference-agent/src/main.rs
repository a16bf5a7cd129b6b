//! `csi-agent`: the reference agent (not built yet; see issue 7).

fn main() {
    eprintln!("csi-agent is not built yet; see the README");
    std::process::exit(2);
}
