//! Region maths of fused leaves: which region of a material a leaf's output region needs.

use crate::array::Region;
use crate::plan::fft_params::FftStep;

/// The region of the FFT's input that output region `out` needs: the same ranges on the
/// other axes, the whole used extent on transformed axes.
pub fn input_region(steps: &[FftStep], in_shape: &[u64], out: &Region) -> Region {
    let mut region = out.clone();
    for s in steps {
        region.start[s.axis] = 0;
        region.shape[s.axis] = in_shape[s.axis].min(s.kind.in_len(s.n) as u64);
    }
    region
}
