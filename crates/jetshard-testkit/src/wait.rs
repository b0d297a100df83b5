//! Waiting for a condition without bare sleeps.

use std::future::Future;
use std::time::Duration;

use crate::Error;

/// The pause between two checks of the condition.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Checks `condition` every 20 ms until it returns `true`, for at most `deadline`.
///
/// `deadline` bounds the whole wait, including a check that hangs: a check still running
/// when time is up is dropped.
///
/// # Errors
///
/// [`Error::Timeout`], whose message names `what`.
///
/// # Examples
///
/// ```no_run
/// # async fn example(client: async_nats::Client) -> Result<(), jetshard_testkit::Error> {
/// use std::time::Duration;
/// use async_nats::connection::State;
/// use jetshard_testkit::wait_until;
///
/// wait_until(Duration::from_secs(5), "the client to reconnect", || async {
///     client.connection_state() == State::Connected
/// })
/// .await?;
/// # Ok(())
/// # }
/// ```
pub async fn wait_until<F, Fut>(
    deadline: Duration,
    what: &str,
    mut condition: F,
) -> Result<(), Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let poll = async {
        while !condition().await {
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    };
    tokio::time::timeout(deadline, poll)
        .await
        .map_err(|_| Error::Timeout {
            what: what.to_owned(),
            after: deadline,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn a_condition_that_becomes_true_ends_the_wait() {
        let checks = AtomicUsize::new(0);
        wait_until(Duration::from_secs(5), "the third check", || async {
            checks.fetch_add(1, Ordering::SeqCst) == 2
        })
        .await
        .expect("the condition held");
        assert_eq!(checks.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_timeout_names_what_was_awaited() {
        let error = wait_until(Duration::from_millis(50), "pigs to fly", || async { false })
            .await
            .unwrap_err();
        assert!(matches!(error, Error::Timeout { .. }), "{error:?}");
        assert!(error.to_string().contains("pigs to fly"), "{error}");
    }

    #[tokio::test]
    async fn a_hanging_check_is_bounded_by_the_deadline() {
        let error = wait_until(Duration::from_millis(50), "a hanging check", || {
            std::future::pending::<bool>()
        })
        .await
        .unwrap_err();
        assert!(error.to_string().contains("a hanging check"), "{error}");
    }
}
