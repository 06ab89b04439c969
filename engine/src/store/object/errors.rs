//! Describing object_store errors: HTTP meanings spelled out, timeouts named with the
//! settings that bound them.

use super::timeouts::Timeouts;

/// A short description of an object_store error, with the HTTP meaning spelled out.
pub(super) fn describe(e: &object_store::Error) -> String {
    use object_store::Error as E;
    match e {
        E::NotFound { .. } => "not found (HTTP 404)".to_string(),
        E::PermissionDenied { source, .. } => {
            format!(
                "access denied (HTTP 403): check the credentials and the bucket policy ({source})"
            )
        }
        E::Unauthenticated { source, .. } => {
            format!("not authenticated (HTTP 401): set the cloud's credential variables ({source})")
        }
        other if timed_out(other) => {
            let t = Timeouts::current();
            format!(
                "timed out: no answer within {:.0} s per request (CHUNKFUSE_IO_TIMEOUT_S), \
                 {:.0} s to connect (CHUNKFUSE_IO_CONNECT_TIMEOUT_S), retried for {:.0} s \
                 (CHUNKFUSE_IO_RETRY_TIMEOUT_S) ({})",
                t.request.as_secs_f64(),
                t.connect.as_secs_f64(),
                t.retry.as_secs_f64(),
                chain(other)
            )
        }
        other => {
            let text = chain(other);
            if text.contains("URL scheme is not allowed") {
                // reqwest refuses plain http unless the store allows it.
                format!("{text}: the endpoint is plain http; set AWS_ALLOW_HTTP=true to allow it")
            } else {
                text
            }
        }
    }
}

/// True when `e` (or a cause of it) is a request or connection that timed out.
fn timed_out(e: &object_store::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if c.downcast_ref::<reqwest::Error>()
            .is_some_and(|r| r.is_timeout())
        {
            return true;
        }
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::TimedOut {
                return true;
            }
        }
        cause = c.source();
    }
    let text = chain(e).to_ascii_lowercase();
    text.contains("timed out") || text.contains("operation timeout")
}

/// `e` and its causes, joined: "builder error" alone says nothing.
fn chain(e: &object_store::Error) -> String {
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
}
