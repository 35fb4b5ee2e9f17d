//! The one bound on compare-and-set loops. Every record is changed by
//! reading it, letting its machine decide, and writing what it decided
//! conditional on the version read; a conflicting writer means reading and
//! deciding again, at most [`ATTEMPTS`] times.

/// How many times a read → decide → conditional write is tried: each
/// failed try means another writer changed the record in between.
pub const ATTEMPTS: usize = 25;

/// How one try ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Try<T> {
    /// Written (or nothing to write): the answer.
    Done(T),
    /// Another writer changed the record since it was read: read again.
    Again,
}

/// Runs `attempt` until it is done, at most [`ATTEMPTS`] times. `None`
/// when every try met a conflicting writer. (A closure returning a future,
/// not an async closure: handlers' futures must be `Send`, which an async
/// closure's borrowing future cannot yet be shown to be.)
pub async fn until_written<T, E, F>(mut attempt: impl FnMut() -> F) -> Result<Option<T>, E>
where
    F: std::future::Future<Output = Result<Try<T>, E>>,
{
    for _ in 0..ATTEMPTS {
        if let Try::Done(t) = attempt().await? {
            return Ok(Some(t));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_try_is_repeated_while_it_conflicts_and_no_more_than_the_bound() {
        let mut tries = 0;
        let got: Result<_, ()> = until_written(|| {
            tries += 1;
            let t = tries;
            async move { Ok(if t < 3 { Try::Again } else { Try::Done(t) }) }
        })
        .await;
        assert_eq!(got, Ok(Some(3)));
        let mut tries = 0;
        let never: Result<Option<()>, ()> = until_written(|| {
            tries += 1;
            async { Ok(Try::Again) }
        })
        .await;
        assert_eq!((never, tries), (Ok(None), ATTEMPTS));
        let failed: Result<Option<()>, &str> = until_written(|| async { Err("down") }).await;
        assert_eq!(failed, Err("down"));
    }
}
