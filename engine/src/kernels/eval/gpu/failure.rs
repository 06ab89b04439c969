//! CUDA failures as the engine's errors: failed driver and NVRTC calls, and panics inside
//! cudarc (where a loaded library lacks a symbol).

use crate::error::{Error, ErrorKind, Result};

/// A CUDA failure while doing `what`.
pub(super) fn cuda_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Internal, format!("CUDA: {what}: {e}"))
}

/// The message of a panic inside cudarc (it panics where a loaded library lacks a symbol, as
/// an older driver or NVRTC may).
pub(super) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("the CUDA libraries failed")
        .to_string()
}

/// `f()`, with a panic inside cudarc turned into an error naming `what`.
pub(super) fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|panic| Err(cuda_error(what, panic_message(panic.as_ref()))))
}
