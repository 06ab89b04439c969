//! Reading one region of a fused value: which chunks each leaf needs ([`read`]), and
//! assembling the decoded chunks into one buffer per leaf, the decoded chunk itself when it is
//! exactly the region needed ([`assemble`]); FFT leaves are transformed as they are assembled.

pub mod assemble;
mod fft_leaf;
pub mod read;
