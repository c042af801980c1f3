//! Writes the fuzz targets' seed corpus (`fuzz/seeds/<target>/<name>`):
//! valid inputs made by the real encoders. Run it after a format change:
//!
//! ```text
//! cargo run -p idem-sled --features fuzzing --example fuzz_seeds
//! ```
//!
//! A unit test (`committed_seed_corpus_is_what_the_encoders_write`) fails
//! while the committed seeds differ from what this writes.

use std::path::Path;

fn main() -> std::io::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds");
    let mut written = 0;
    for (target, name, input) in idem_sled::fuzzing::seeds() {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join(&name), &input)?;
        written += 1;
    }
    println!("wrote {written} seeds under {}", root.display());
    Ok(())
}
