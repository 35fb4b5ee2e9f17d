//! The one compare-and-set loop and its bound. Every record is changed by
//! reading it, letting its machine decide, and writing what it decided
//! conditional on the version read; a conflicting writer means reading and
//! deciding again, at most [`ATTEMPTS`] times. [`change`] is that for any
//! record whose store is [`Versioned`]; [`until_written`] is the loop
//! itself, for changes that write more than one record (a Run with its
//! events and the items that land with it).

use async_trait::async_trait;

use armada_domain::machine::Machine;

use crate::error::StoreError;

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

/// A store of one kind of record, each written conditional on the
/// version its writer read.
#[async_trait]
pub trait Versioned<R: Machine>: Send + Sync {
    /// Reads the record (strongly consistent).
    async fn read(&self, key: &str) -> Result<Option<R>, StoreError>;
    /// Writes `record` if the stored one is still at `read`; a
    /// [`StoreError::Conflict`] when it is not.
    async fn write_if(&self, read: &R::Version, record: &R) -> Result<(), StoreError>;
}

/// What [`change`] did.
pub enum Changed<R: Machine> {
    /// There is no such record.
    Missing,
    /// The record as read was left alone: nothing to tell it.
    Left(R),
    /// Its machine refused the event (the record as read; nothing written).
    Refused(R, R::Refusal),
    /// Written: the record as it is now, and what its machine decided.
    Written(R, Vec<R::Action>),
}

/// Changes one record through its machine: reads it, lets `event` say
/// what it is told (seeing it as read; `None` leaves it), applies that at
/// `now()`, and writes it conditional on the version read. A conflicting
/// writer makes it read and decide again; `None` when every try met one.
pub async fn change<R, S>(
    store: &S,
    key: &str,
    now: impl Fn() -> i64 + Sync,
    event: impl Fn(&R) -> Option<R::Event> + Sync,
) -> Result<Option<Changed<R>>, StoreError>
where
    R: Machine + Clone + Send + Sync,
    R::Version: Send + Sync,
    R::Event: Send,
    R::Action: Send,
    R::Refusal: Send,
    S: Versioned<R> + ?Sized,
{
    until_written(|| async {
        let Some(read) = store.read(key).await? else {
            return Ok(Try::Done(Changed::Missing));
        };
        let Some(told) = event(&read) else {
            return Ok(Try::Done(Changed::Left(read)));
        };
        let version = read.version();
        let mut next = read.clone();
        let actions = match next.apply(told, now()) {
            Ok(actions) => actions,
            Err(refusal) => return Ok(Try::Done(Changed::Refused(read, refusal))),
        };
        match store.write_if(&version, &next).await {
            Ok(()) => Ok(Try::Done(Changed::Written(next, actions))),
            Err(StoreError::Conflict { .. }) => Ok(Try::Again),
            Err(e) => Err(e),
        }
    })
    .await
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

    /// A counter that takes `Add(max)` while below `max`.
    #[derive(Debug, Clone, PartialEq)]
    struct Counter {
        n: u32,
        version: u64,
    }

    impl Machine for Counter {
        type Event = u32;
        type Action = u32;
        type Refusal = &'static str;
        type Version = u64;

        fn apply(&mut self, max: u32, _now_ms: i64) -> Result<Vec<u32>, &'static str> {
            if self.n >= max {
                return Err("full");
            }
            self.n += 1;
            Ok(vec![self.n])
        }

        fn version(&self) -> u64 {
            self.version
        }
    }

    /// One stored counter; the first `rivals` writes lose to another
    /// writer, who adds one first.
    struct Store {
        stored: std::sync::Mutex<Option<Counter>>,
        rivals: std::sync::atomic::AtomicUsize,
    }

    impl Store {
        fn holding(c: Option<Counter>, rivals: usize) -> Store {
            Store {
                stored: std::sync::Mutex::new(c),
                rivals: rivals.into(),
            }
        }

        fn now(&self) -> Option<Counter> {
            self.stored.lock().unwrap().clone()
        }
    }

    #[async_trait]
    impl Versioned<Counter> for Store {
        async fn read(&self, _key: &str) -> Result<Option<Counter>, StoreError> {
            Ok(self.now())
        }

        async fn write_if(&self, read: &u64, c: &Counter) -> Result<(), StoreError> {
            use std::sync::atomic::Ordering::SeqCst;
            let mut stored = self.stored.lock().unwrap();
            let current = stored.as_mut().expect("stored");
            if self.rivals.load(SeqCst) > 0 {
                self.rivals.fetch_sub(1, SeqCst);
                current.n += 1;
                current.version += 1;
            }
            if current.version != *read {
                return Err(StoreError::Conflict { which: None });
            }
            *current = Counter {
                version: read + 1,
                ..c.clone()
            };
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_change_is_decided_again_on_what_a_rival_wrote() {
        let zero = Counter { n: 0, version: 1 };
        let add_up_to = |max: u32| move |_: &Counter| Some(max);

        let store = Store::holding(Some(zero.clone()), 2);
        let changed = change(&store, "c", || 0, add_up_to(10)).await.unwrap();
        // Two rivals added one each: the change read again and added a third.
        let Some(Changed::Written(c, actions)) = changed else {
            panic!("written");
        };
        assert_eq!((c.n, actions), (3, vec![3]));
        assert_eq!(store.now(), Some(Counter { n: 3, version: 4 }));

        // A rival that fills it first: the machine refuses on the re-read.
        let store = Store::holding(Some(zero.clone()), 1);
        let changed = change(&store, "c", || 0, add_up_to(1)).await.unwrap();
        assert!(matches!(changed, Some(Changed::Refused(c, "full")) if c.n == 1));

        // Nothing to tell it, or nothing there: nothing written.
        let store = Store::holding(Some(zero.clone()), 0);
        let left = change(&store, "c", || 0, |_: &Counter| None).await.unwrap();
        assert!(matches!(left, Some(Changed::Left(c)) if c == zero));
        let store = Store::holding(None, 0);
        let missing = change(&store, "c", || 0, add_up_to(1)).await.unwrap();
        assert!(matches!(missing, Some(Changed::Missing)));

        // Rivals on every try: it gives up within the bound.
        let store = Store::holding(Some(zero), ATTEMPTS);
        let changed = change(&store, "c", || 0, add_up_to(u32::MAX))
            .await
            .unwrap();
        assert!(changed.is_none());
        assert_eq!(store.now().map(|c| c.n), Some(ATTEMPTS as u32));
    }
}
