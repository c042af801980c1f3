//! The seed corpus of every fuzz target (`fuzz/seeds/<target>/`), and the
//! tests that keep it, and the committed findings, in step with the code.

use super::{frames, sled, tables};

/// Valid inputs for each target, made by the real encoders: the seed
/// corpus (`fuzz/seeds/<target>/`). Returns (target, name, input).
pub fn seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut out = Vec::new();
    for (name, input) in frames::record_seeds() {
        out.push(("record", name, input));
    }
    for (name, input) in sled::wal_seeds() {
        out.push(("wal", name, input));
    }
    for (name, input) in sled::sled_value_seeds() {
        out.push(("sled_value", name, input));
    }
    for (name, input) in frames::key_seeds() {
        out.push(("key", name, input));
    }
    for (name, input) in sled::journal_files_seeds() {
        out.push(("journal_files", name, input));
    }
    for (name, input) in tables::tables_seeds() {
        out.push(("tables", name, input));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fuzzing::frames::{key, record, Outcome};
    use crate::fuzzing::sled::{journal_files, sled_value, wal};
    use crate::fuzzing::tables::tables;
    use std::path::{Path, PathBuf};

    const TARGETS: [&str; 6] = [
        "record",
        "wal",
        "sled_value",
        "key",
        "journal_files",
        "tables",
    ];

    fn fuzz_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
    }

    fn target(name: &str) -> fn(&[u8]) -> Outcome {
        match name {
            "record" => record,
            "wal" => wal,
            "sled_value" => sled_value,
            "key" => key,
            "journal_files" => journal_files,
            "tables" => tables,
            other => panic!("no fuzz target {other}"),
        }
    }

    /// The files of `fuzz/<dir>/<target>/`, by name.
    fn inputs(dir: &str, target: &str) -> Vec<(String, Vec<u8>)> {
        let path = fuzz_dir().join(dir).join(target);
        let Ok(entries) = std::fs::read_dir(&path) else {
            return Vec::new();
        };
        let mut out: Vec<_> = entries
            .map(|e| {
                let e = e.expect("readable directory entry");
                let name = e.file_name().to_string_lossy().into_owned();
                (name, std::fs::read(e.path()).expect("readable input"))
            })
            .filter(|(name, _)| !name.starts_with('.') && !name.ends_with(".md"))
            .collect();
        out.sort();
        out
    }

    #[test]
    fn seeds_reach_the_decoders() {
        let seeds = seeds();
        for name in TARGETS {
            assert!(seeds.iter().any(|s| s.0 == name), "no seed for {name}");
        }
        // Both kinds of file of `tables`, as given and as built.
        use crate::fuzzing::tables::{AUDIT, BUILD};
        for mode in [0, AUDIT, BUILD, AUDIT | BUILD] {
            assert!(
                seeds
                    .iter()
                    .any(|s| s.0 == "tables" && s.2[0] & (AUDIT | BUILD) == mode),
                "no seed of tables with flags {mode}"
            );
        }
        for (t, name, input) in seeds {
            assert_eq!(target(t)(&input), Outcome::Decoded, "seed {t}/{name}");
        }
    }

    #[test]
    fn committed_seed_corpus_is_what_the_encoders_write() {
        // If this fails, the format changed: regenerate the seeds with
        // `cargo run -p idem-sled --features fuzzing --example fuzz_seeds`.
        for (t, name, input) in seeds() {
            let committed = inputs("seeds", t);
            let found = committed.iter().find(|(n, _)| *n == name);
            assert_eq!(
                found.map(|(_, b)| b),
                Some(&input),
                "fuzz/seeds/{t}/{name} is missing or stale"
            );
        }
    }

    #[test]
    fn committed_fuzz_findings_replay_without_failing() {
        let mut replayed = 0;
        for t in TARGETS {
            for (name, input) in inputs("regressions", t) {
                let outcome = std::panic::catch_unwind(|| target(t)(&input));
                assert!(outcome.is_ok(), "fuzz/regressions/{t}/{name} fails again");
                replayed += 1;
            }
        }
        assert!(
            replayed > 0,
            "no committed fuzz findings under {:?}",
            fuzz_dir()
        );
    }
}
