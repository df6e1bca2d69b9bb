//! Answers that cost memory while they are written (`/metrics`, `/api/v1/failures`): a few at
//! once and one per client (the Pod's own loopback has no share: `Client::has_share`), each waiting its turn for a bounded time (then 503); the turn is
//! held until the answer's last piece is handed to the connection, so a client that does not
//! read holds one turn, not memory without end.
//!
//! tower's `ConcurrencyLimit` waits without a deadline and knows no clients, and its
//! `LoadShed` refuses at once; neither keeps the turn past the handler while the body is
//! written, which is where the memory is.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use futures::StreamExt;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use super::listen::Client;

/// The pieces an answer is handed to the connection in: hyper asks for the next only when it
/// has written most of the last.
pub const PIECE: usize = 64 << 10;

pub struct Heavy {
    slots: Arc<Semaphore>,
    per_client: usize,
    clients: Mutex<HashMap<Client, usize>>,
    freed: Notify,
    wait: Duration,
}

/// One heavy answer's turn; given back when dropped.
pub struct Turn {
    heavy: Arc<Heavy>,
    client: Client,
    _permit: OwnedSemaphorePermit,
}

impl Heavy {
    /// `at_once` answers in all, `per_client` of them one client's; a request waits at most
    /// `wait` for its turn.
    pub fn new(at_once: usize, per_client: usize, wait: Duration) -> Arc<Heavy> {
        Arc::new(Heavy {
            slots: Arc::new(Semaphore::new(at_once.max(1))),
            per_client: per_client.max(1),
            clients: Mutex::new(HashMap::new()),
            freed: Notify::new(),
            wait,
        })
    }

    /// The client's turn, or None when it did not come within the wait.
    pub async fn turn(self: &Arc<Heavy>, client: Client) -> Option<Turn> {
        let deadline = tokio::time::Instant::now() + self.wait;
        loop {
            // Registered before looking, so a turn given back in between still wakes us.
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if self.take_share(client) {
                break;
            }
            tokio::time::timeout_at(deadline, freed).await.ok()?;
        }
        match tokio::time::timeout_at(deadline, self.slots.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Some(Turn {
                heavy: self.clone(),
                client,
                _permit: permit,
            }),
            _ => {
                self.give_share(client);
                None
            }
        }
    }

    fn take_share(&self, client: Client) -> bool {
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        let mine = clients.entry(client).or_default();
        if *mine < self.per_client || !client.has_share() {
            *mine += 1;
            true
        } else {
            false
        }
    }

    fn give_share(&self, client: Client) {
        {
            let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(mine) = clients.get_mut(&client) {
                *mine = mine.saturating_sub(1);
                if *mine == 0 {
                    clients.remove(&client);
                }
            }
        }
        self.freed.notify_waiters();
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.heavy.give_share(self.client);
    }
}

/// `bytes` as a body of [`PIECE`]s, holding `turn` until the last is taken.
pub fn in_pieces(bytes: Bytes, turn: Turn) -> Body {
    let len = bytes.len();
    let pieces = (0..len)
        .step_by(PIECE)
        .map(move |at| bytes.slice(at..(at + PIECE).min(len)));
    Body::from_stream(futures::stream::iter(pieces).map(move |piece| {
        let _turn = &turn;
        Ok::<_, Infallible>(piece)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn client(last: u8) -> Client {
        Client::of(std::net::IpAddr::from([10, 0, 0, last]))
    }

    #[tokio::test]
    async fn turns_are_few_one_per_client_and_waited_for_a_bounded_time() {
        let heavy = Heavy::new(2, 1, Duration::from_millis(300));
        let a = heavy.turn(client(1)).await.unwrap();
        // The same client again: waits for its own first turn, then is refused.
        let started = tokio::time::Instant::now();
        assert!(heavy.turn(client(1)).await.is_none());
        assert!(started.elapsed() >= Duration::from_millis(300));
        let heavy = Heavy::new(2, 1, Duration::from_secs(10));
        let a = {
            drop(a);
            heavy.turn(client(1)).await.unwrap()
        };
        let b = heavy.turn(client(2)).await.unwrap();
        // Both slots held: a third client waits, and gets the slot given back.
        let waiting = tokio::spawn({
            let heavy = heavy.clone();
            async move { heavy.turn(client(3)).await.is_some() }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiting.is_finished());
        drop(a);
        assert!(waiting.await.unwrap());
        // A client's own turn given back lets its next one in.
        let next = tokio::spawn({
            let heavy = heavy.clone();
            async move { heavy.turn(client(2)).await.is_some() }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!next.is_finished());
        drop(b);
        assert!(next.await.unwrap());
        assert!(
            heavy.clients.lock().unwrap().is_empty(),
            "no client left behind"
        );
    }

    #[tokio::test]
    async fn pieces_make_the_whole_and_the_turn_ends_with_the_body() {
        let heavy = Heavy::new(1, 1, Duration::from_millis(10));
        let text: Vec<u8> = (0..PIECE * 2 + 17).map(|i| (i % 251) as u8).collect();
        let turn = heavy.turn(client(1)).await.unwrap();
        let body = in_pieces(Bytes::from(text.clone()), turn);
        assert!(
            heavy.turn(client(2)).await.is_none(),
            "held while unwritten"
        );
        let mut frames = 0;
        let mut got = Vec::new();
        let mut body = body;
        while let Some(frame) = body.frame().await {
            got.extend_from_slice(frame.unwrap().data_ref().unwrap());
            frames += 1;
        }
        assert_eq!((frames, got == text), (3, true));
        drop(body);
        assert!(heavy.turn(client(2)).await.is_some());
    }
}
