//! `armada-sandbox`: the program inside every sandbox task.
//!
//! - `armada-sandbox exec`: the jail (internal): confines itself as the
//!   spec in `ARMADA_JAIL_SPEC` says, then runs the call.

use armada_sandbox::jail::{self, JailSpec};

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_default();
    match mode.as_str() {
        // The jail must stay single-threaded: no runtime is started for it.
        "exec" => {
            let spec: JailSpec = match std::env::var(jail::SPEC_ENV)
                .map_err(|e| e.to_string())
                .and_then(|s| serde_json::from_str(&s).map_err(|e| e.to_string()))
            {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("armada-sandbox exec: bad {}: {e}", jail::SPEC_ENV);
                    std::process::exit(jail::REFUSED);
                }
            };
            std::process::exit(jail::run(&spec));
        }
        other => {
            eprintln!("usage: armada-sandbox exec   (unknown mode '{other}')");
            std::process::exit(2);
        }
    }
}
