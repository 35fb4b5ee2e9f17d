//! `armada-sandbox`: the program inside every sandbox task (the Fargate
//! image's entrypoint): `armada-sandbox agent` serves the task, `exec` is
//! the jail. See [`armada_sandbox::entry`].

use armada_sandbox::entry;
use armada_sandbox::program::Program;

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_default();
    let code = match Program::current(&[]) {
        Ok(program) => entry::main(program, &mode),
        Err(e) => {
            eprintln!("armada-sandbox: cannot find my own executable: {e}");
            1
        }
    };
    std::process::exit(code);
}
