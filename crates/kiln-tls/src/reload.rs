//! SIGHUP as the signal to read certificate files again, for every service that serves TLS.

/// Calls `reload` on every SIGHUP, forever (the caller aborts the task to stop). Where the
/// signal cannot be listened for, says so and returns: the files are then read at start only.
pub async fn on_sighup(mut reload: impl FnMut()) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hup = match signal(SignalKind::hangup()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGHUP; certificates are read at start only");
            return;
        }
    };
    while hup.recv().await.is_some() {
        reload();
    }
}

/// Logs a reload of `what`'s files (`the Kafka listener`): on failure the old settings stay
/// in use, and the error names the file.
pub fn log_reload(what: &str, result: Result<(), crate::TlsError>) {
    match result {
        Ok(()) => tracing::info!("SIGHUP: reloaded {what}'s TLS certificate"),
        Err(e) => tracing::error!(error = %e, "SIGHUP: keeping {what}'s old TLS settings"),
    }
}
