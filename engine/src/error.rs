//! The engine's one error type: a category, a message, and the context (array, chunk key,
//! store URL, plan field) in which it happened.

use std::fmt;

/// What kind of failure an [`Error`] is; front ends map each kind to its own exception class
/// and the CLI to its exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The plan is invalid (unknown op, shape mismatch, bad dtype, missing parameter, ...).
    Plan,
    /// A store could not be read or written (missing path, permission, IO).
    Store,
    /// A chunk or metadata document could not be decoded (corrupt or truncated data).
    Corrupt,
    /// The memory budget cannot hold a task.
    Memory,
    /// The run was cancelled (Ctrl-C).
    Cancelled,
    /// Something the engine does not support yet.
    Unsupported,
    /// The data has no answer for the computation asked (numpy raises ValueError): an
    /// all-NaN slice given to nanargmin or nanargmax.
    Value,
    /// A bug in the engine: an invariant did not hold.
    Internal,
}

impl ErrorKind {
    /// A short lowercase label used as the message prefix.
    pub fn label(self) -> &'static str {
        match self {
            ErrorKind::Plan => "plan error",
            ErrorKind::Store => "store error",
            ErrorKind::Corrupt => "corrupt data",
            ErrorKind::Memory => "memory budget exceeded",
            ErrorKind::Cancelled => "cancelled",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Value => "invalid value",
            ErrorKind::Internal => "internal error",
        }
    }
}

/// Where an error happened. Every field is optional; the message shows those that are set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ErrorContext {
    /// JSON path of the offending plan field, e.g. `ops[1].expr.args[0]`.
    pub field: Option<String>,
    /// Array id (plan) or array path (store).
    pub array: Option<String>,
    /// Chunk key inside the store, e.g. `c/3/0/0`.
    pub chunk_key: Option<String>,
    /// Store URL or local path.
    pub store: Option<String>,
}

/// The engine's error: a kind, a message and its context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    /// The category, deciding exception class and exit status.
    pub kind: ErrorKind,
    /// What went wrong, in words.
    pub message: String,
    /// Where it went wrong (boxed to keep `Result`s small).
    pub context: Box<ErrorContext>,
}

/// Result with the engine's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A new error of `kind` with `message` and no context yet.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            context: Box::default(),
        }
    }

    /// A plan error at JSON path `field`.
    pub fn plan(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Plan, message).with_field(field)
    }

    /// A store error for `store`.
    pub fn store(store: impl Into<String>, message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Store, message).with_store(store)
    }

    /// An internal invariant violation.
    pub fn internal(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Internal, message)
    }

    /// The run was cancelled.
    pub fn cancelled() -> Self {
        Error::new(
            ErrorKind::Cancelled,
            "interrupted; no partial chunk was written",
        )
    }

    /// Sets the plan field unless one is already set (the innermost context wins).
    pub fn with_field(mut self, field: impl Into<String>) -> Self {
        self.context.field.get_or_insert_with(|| field.into());
        self
    }

    /// Sets the array unless one is already set.
    pub fn with_array(mut self, array: impl Into<String>) -> Self {
        self.context.array.get_or_insert_with(|| array.into());
        self
    }

    /// Sets the chunk key unless one is already set.
    pub fn with_chunk_key(mut self, key: impl Into<String>) -> Self {
        self.context.chunk_key.get_or_insert_with(|| key.into());
        self
    }

    /// Sets the store unless one is already set.
    pub fn with_store(mut self, store: impl Into<String>) -> Self {
        self.context.store.get_or_insert_with(|| store.into());
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.kind.label())?;
        if let Some(field) = &self.context.field {
            write!(f, " at {field}")?;
        }
        write!(f, ": ")?;
        let mut wrote_place = false;
        if let Some(array) = &self.context.array {
            write!(f, "array \"{array}\"")?;
            wrote_place = true;
        }
        if let Some(key) = &self.context.chunk_key {
            write!(
                f,
                "{}chunk key \"{key}\"",
                if wrote_place { " " } else { "" }
            )?;
            wrote_place = true;
        }
        if let Some(store) = &self.context.store {
            write!(
                f,
                "{}in store \"{store}\"",
                if wrote_place { " " } else { "" }
            )?;
            wrote_place = true;
        }
        if wrote_place {
            write!(f, ": ")?;
        }
        write!(f, "{}", self.message)
    }
}

impl std::error::Error for Error {}

/// Adds context to the error of a `Result`.
pub trait ResultExt<T> {
    /// Names the array.
    fn array_ctx(self, array: &str) -> Result<T>;
    /// Names the chunk key.
    fn chunk_ctx(self, key: &str) -> Result<T>;
    /// Names the store.
    fn store_ctx(self, store: &str) -> Result<T>;
    /// Names the plan field.
    fn field_ctx(self, field: &str) -> Result<T>;
}

impl<T> ResultExt<T> for Result<T> {
    fn array_ctx(self, array: &str) -> Result<T> {
        self.map_err(|e| e.with_array(array))
    }
    fn chunk_ctx(self, key: &str) -> Result<T> {
        self.map_err(|e| e.with_chunk_key(key))
    }
    fn store_ctx(self, store: &str) -> Result<T> {
        self.map_err(|e| e.with_store(store))
    }
    fn field_ctx(self, field: &str) -> Result<T> {
        self.map_err(|e| e.with_field(field))
    }
}

/// Returns early with a plan error at `field` when `cond` is false.
#[macro_export]
macro_rules! plan_ensure {
    ($cond:expr, $field:expr, $($arg:tt)*) => {
        if !$cond {
            return Err($crate::error::Error::plan($field, format!($($arg)*)));
        }
    };
}

/// Returns early with a plan error at `field`.
#[macro_export]
macro_rules! plan_bail {
    ($field:expr, $($arg:tt)*) => {
        return Err($crate::error::Error::plan($field, format!($($arg)*)))
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_names_every_context_field() {
        let e = Error::new(ErrorKind::Corrupt, "zstd: unknown frame descriptor")
            .with_chunk_key("c/3/0/0")
            .with_array("x")
            .with_store("/data/era5.zarr");
        assert_eq!(
            e.to_string(),
            "corrupt data: array \"x\" chunk key \"c/3/0/0\" in store \"/data/era5.zarr\": zstd: unknown frame descriptor"
        );
    }

    #[test]
    fn innermost_context_wins() {
        let e = Error::plan("ops[1].expr", "bad").with_field("ops[1]");
        assert_eq!(e.context.field.as_deref(), Some("ops[1].expr"));
        assert_eq!(e.to_string(), "plan error at ops[1].expr: bad");
    }
}
