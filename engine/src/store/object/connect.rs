//! Building the object_store client of a URL: the scheme's builder, configured from the
//! environment, signed only when credentials are set.

use std::sync::Arc;

use object_store::ObjectStore;

use super::errors::describe;
use super::runtime::install_crypto_provider;
use super::timeouts::{client_options, retry_config, Timeouts};
use super::ObjectBackend;
use crate::error::{Error, Result};

/// The configuration keys a builder knows among the environment variables starting with
/// `prefix` (as object_store's `from_env` reads them).
fn env_config<K: std::str::FromStr>(prefix: &str) -> Vec<(K, String)> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, _)| k.starts_with(prefix))
        .filter_map(|(k, v)| Some((k.to_ascii_lowercase().parse().ok()?, v)))
        .collect()
}

/// True when any of `names` is set in the environment.
fn any_env(names: &[&str]) -> bool {
    names.iter().any(|n| std::env::var_os(n).is_some())
}

/// Splits `scheme://bucket/some/prefix` into the bucket URL and the prefix inside it.
pub(super) fn split_bucket(url: &str) -> Result<(String, String)> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| Error::store(url, "not a URL"))?;
    let rest = rest.trim_end_matches('/');
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(Error::store(url, "the URL names no bucket"));
    }
    Ok((format!("{scheme}://{bucket}"), prefix.to_string()))
}

impl ObjectBackend {
    /// The client for `url` and the path prefix inside its bucket.
    pub(super) fn client_for(url: &str) -> Result<(Arc<dyn ObjectStore>, String)> {
        install_crypto_provider();
        let fail = |e: object_store::Error| Error::store(url, describe(&e));
        let timeouts = Timeouts::current();
        let scheme = url.split_once("://").map(|(s, _)| s).unwrap_or("");
        let (store, prefix): (Arc<dyn ObjectStore>, String) = match scheme {
            "s3" | "s3a" => {
                let (bucket, prefix) = split_bucket(url)?;
                let mut b = object_store::aws::AmazonS3Builder::new()
                    .with_retry(retry_config(&timeouts))
                    .with_client_options(client_options(&timeouts));
                // The environment (AWS_ENDPOINT_URL, AWS_ALLOW_HTTP, ...) over our defaults.
                for (key, value) in env_config("AWS_") {
                    b = b.with_config(key, value);
                }
                let mut b = b.with_url(bucket);
                let signed = any_env(&[
                    "AWS_ACCESS_KEY_ID",
                    "AWS_WEB_IDENTITY_TOKEN_FILE",
                    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                ]);
                if !signed {
                    b = b.with_skip_signature(true);
                }
                (Arc::new(b.build().map_err(fail)?), prefix)
            }
            "gs" | "gcs" => {
                let (bucket, prefix) = split_bucket(url)?;
                let mut b = object_store::gcp::GoogleCloudStorageBuilder::new()
                    .with_retry(retry_config(&timeouts))
                    .with_client_options(client_options(&timeouts));
                for (key, value) in env_config("GOOGLE_") {
                    b = b.with_config(key, value);
                }
                if let Ok(path) = std::env::var("SERVICE_ACCOUNT") {
                    b = b.with_service_account_path(path);
                }
                let mut b = b.with_url(bucket);
                let signed = any_env(&[
                    "GOOGLE_SERVICE_ACCOUNT",
                    "GOOGLE_SERVICE_ACCOUNT_PATH",
                    "GOOGLE_SERVICE_ACCOUNT_KEY",
                    "GOOGLE_APPLICATION_CREDENTIALS",
                ]);
                if !signed {
                    b = b.with_skip_signature(true);
                }
                (Arc::new(b.build().map_err(fail)?), prefix)
            }
            "http" | "https" => {
                let b = object_store::http::HttpBuilder::new()
                    .with_url(url.trim_end_matches('/'))
                    .with_retry(retry_config(&timeouts))
                    .with_client_options(client_options(&timeouts).with_allow_http(true));
                (Arc::new(b.build().map_err(fail)?), String::new())
            }
            other => {
                return Err(Error::store(
                    url,
                    format!("the \"{other}://\" scheme is not supported; use a local path, file://, s3://, gs://, http(s):// or memory://"),
                ))
            }
        };
        Ok((store, prefix))
    }
}
