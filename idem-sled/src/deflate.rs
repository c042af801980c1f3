//! Raw deflate (miniz_oxide, pure Rust) for what the sled journal stores
//! compressed: audit buckets in sled (`events.rs`) and the units of its
//! image (`image.rs`). Compressing reuses one compressor; inflating checks
//! that a stream yields exactly the length stored beside it, under a bound
//! the caller gives, so a damaged length cannot make a read allocate
//! without limit.

use miniz_oxide::deflate::core::{
    compress, create_comp_flags_from_zip_params, CompressorOxide, TDEFLFlush, TDEFLStatus,
};

/// A compressor kept across inputs: its tables (a few hundred KiB) are
/// allocated once, not per input, which would churn the allocator on every
/// bucket a checkpoint rewrites.
pub(super) struct Deflater {
    state: Box<CompressorOxide>,
}

impl Deflater {
    /// A compressor at `level` (1: fastest … 9: smallest).
    pub(super) fn new(level: u8) -> Deflater {
        let flags = create_comp_flags_from_zip_params(level.into(), 0, 0);
        Deflater {
            state: Box::new(CompressorOxide::new(flags)),
        }
    }

    /// Appends `input`, compressed as one raw deflate stream, to `out`.
    pub(super) fn compress_into(&mut self, mut input: &[u8], out: &mut Vec<u8>) {
        self.state.reset();
        let mut written = out.len();
        out.reserve(64 + input.len() / 2);
        loop {
            if out.len() - written < 64 {
                out.resize(out.len().max(64) * 2, 0);
            }
            let (status, read, wrote) = compress(
                &mut self.state,
                input,
                &mut out[written..],
                TDEFLFlush::Finish,
            );
            written += wrote;
            input = &input[read..];
            match status {
                TDEFLStatus::Done => break,
                TDEFLStatus::Okay => {}
                // Only a misuse of the compressor (a bad parameter, a call
                // after it finished without a reset) gets here; none is
                // possible above.
                other => unreachable!("deflate refused its input: {other:?}"),
            }
        }
        out.truncate(written);
    }
}

/// Inflates `packed`, which must yield exactly `len` bytes; a `len` above
/// `max` is refused before anything is allocated. `what` names the thing
/// in the error.
pub(super) fn inflate_exact(
    packed: &[u8],
    len: usize,
    max: usize,
    what: &str,
) -> Result<Vec<u8>, String> {
    if len > max {
        return Err(format!("{what} claims {len} bytes"));
    }
    let plain = miniz_oxide::inflate::decompress_to_vec_with_limit(packed, len)
        .map_err(|e| format!("{what} does not inflate: {e}"))?;
    if plain.len() != len {
        return Err(format!(
            "{what} inflates to {} bytes, not the {len} it claims",
            plain.len()
        ));
    }
    Ok(plain)
}
