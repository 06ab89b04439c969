//! What a transform computes, as parameters: the steps along one axis each (their kind, axis
//! and length) and the normalisation. The kernels (`kernels::fft`) run them on blocks.

/// What one step computes along its axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FftStepKind {
    /// Complex → complex, forward (`fft`).
    Forward,
    /// Complex → complex, inverse (`ifft`).
    Inverse,
    /// Real → complex, forward, keeping `n / 2 + 1` values (`rfft`).
    RealForward,
    /// Hermitian complex → real, inverse (`irfft`).
    RealInverse,
}

impl FftStepKind {
    /// True for the steps whose unnormalised direction is the inverse one.
    pub fn is_inverse(self) -> bool {
        matches!(self, FftStepKind::Inverse | FftStepKind::RealInverse)
    }

    /// Length of the step's output along its axis.
    pub fn out_len(self, n: usize) -> usize {
        match self {
            FftStepKind::RealForward => n / 2 + 1,
            _ => n,
        }
    }

    /// How many input values along the axis the step uses (the rest is cropped).
    pub fn in_len(self, n: usize) -> usize {
        match self {
            FftStepKind::RealInverse => n / 2 + 1,
            _ => n,
        }
    }
}

/// numpy's `norm`: which direction is scaled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FftNorm {
    /// Inverse scaled by `1/n` (numpy's default).
    Backward,
    /// Both scaled by `1/sqrt(n)`.
    Ortho,
    /// Forward scaled by `1/n`.
    Forward,
}

impl FftNorm {
    /// Parses numpy's names.
    pub fn parse(name: &str) -> Option<FftNorm> {
        match name {
            "backward" => Some(FftNorm::Backward),
            "ortho" => Some(FftNorm::Ortho),
            "forward" => Some(FftNorm::Forward),
            _ => None,
        }
    }

    /// numpy's name.
    pub fn name(self) -> &'static str {
        match self {
            FftNorm::Backward => "backward",
            FftNorm::Ortho => "ortho",
            FftNorm::Forward => "forward",
        }
    }

    /// The factor of a transform of length `n` in direction `inverse`.
    pub fn scale(self, n: usize, inverse: bool) -> f64 {
        let n = n.max(1) as f64;
        match (self, inverse) {
            (FftNorm::Ortho, _) => 1.0 / n.sqrt(),
            (FftNorm::Backward, true) | (FftNorm::Forward, false) => 1.0 / n,
            _ => 1.0,
        }
    }
}

/// One transform along one axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FftStep {
    /// The axis of the block.
    pub axis: usize,
    /// What it computes.
    pub kind: FftStepKind,
    /// The transform length (numpy's `n`).
    pub n: usize,
}
