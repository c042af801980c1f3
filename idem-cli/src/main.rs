//! `idem`: see the crate documentation of `idem_cli`.

fn main() -> std::process::ExitCode {
    idem_cli::main()
}
