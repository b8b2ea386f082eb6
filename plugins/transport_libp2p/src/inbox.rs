//! Queues that hand what the swarm receives to Python without ever blocking the swarm.
//!
//! The swarm only ever pushes (a short, uncontended lock) and Python pulls batches
//! asynchronously. Counted items (broadcast messages, inbound requests) are bounded: when the
//! queue is full a message is dropped and a `Lagged` marker records where the gap is and how
//! many were lost, so the loss is always reported and reported in order.

use std::collections::VecDeque;
use std::sync::Mutex;

use tokio::sync::Notify;

pub enum Item<T> {
    Value(T),
    Lagged(u64),
}

struct State<T> {
    queue: VecDeque<(Item<T>, bool)>,
    counted: usize,
    closed: bool,
    dropped_total: u64,
}

pub struct Inbox<T> {
    state: Mutex<State<T>>,
    notify: Notify,
    capacity: usize,
}

impl<T> Inbox<T> {
    pub fn new(capacity: usize) -> Self {
        Self {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                counted: 0,
                closed: false,
                dropped_total: 0,
            }),
            notify: Notify::new(),
            capacity: capacity.max(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<T>> {
        // A panic while holding this lock cannot leave the queue inconsistent, so ignore poison.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queue an item that is never dropped (peer up/down, notices): these are rare and small.
    pub fn push(&self, value: T) {
        let mut s = self.lock();
        if s.closed {
            return;
        }
        s.queue.push_back((Item::Value(value), false));
        drop(s);
        self.notify.notify_one();
    }

    /// Queue a bounded item; gives it back when the queue is full.
    pub fn offer(&self, value: T) -> Result<(), T> {
        let mut s = self.lock();
        if s.closed {
            return Ok(()); // nobody will read it anyway
        }
        if s.counted >= self.capacity {
            return Err(value);
        }
        s.counted += 1;
        s.queue.push_back((Item::Value(value), true));
        drop(s);
        self.notify.notify_one();
        Ok(())
    }

    /// Queue a bounded item, or count it dropped behind a `Lagged` marker when full.
    /// Returns false when it was dropped.
    pub fn offer_or_lag(&self, value: T) -> bool {
        let mut s = self.lock();
        if s.closed {
            return true;
        }
        if s.counted < self.capacity {
            s.counted += 1;
            s.queue.push_back((Item::Value(value), true));
            drop(s);
            self.notify.notify_one();
            return true;
        }
        s.dropped_total += 1;
        // One marker per gap: grow the marker at the tail, or start a new one.
        match s.queue.back_mut() {
            Some((Item::Lagged(n), _)) => *n += 1,
            _ => s.queue.push_back((Item::Lagged(1), false)),
        }
        drop(s);
        self.notify.notify_one();
        false
    }

    pub fn dropped_total(&self) -> u64 {
        self.lock().dropped_total
    }

    pub fn close(&self) {
        self.lock().closed = true;
        self.notify.notify_waiters();
        self.notify.notify_one();
    }

    /// Wait for at least one item and return up to `max`; `None` once closed and drained.
    pub async fn pop_batch(&self, max: usize) -> Option<Vec<Item<T>>> {
        loop {
            {
                let mut s = self.lock();
                if !s.queue.is_empty() {
                    let n = max.max(1).min(s.queue.len());
                    let mut out = Vec::with_capacity(n);
                    for _ in 0..n {
                        let (item, counted) = s.queue.pop_front().expect("checked non-empty");
                        if counted {
                            s.counted -= 1;
                        }
                        out.push(item);
                    }
                    return Some(out);
                }
                if s.closed {
                    return None;
                }
            }
            // notify_one keeps a permit when nobody waits, so a push between the check above
            // and this await is not missed.
            self.notify.notified().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(items: Vec<Item<u32>>) -> Vec<String> {
        items
            .into_iter()
            .map(|i| match i {
                Item::Value(v) => v.to_string(),
                Item::Lagged(n) => format!("lag{n}"),
            })
            .collect()
    }

    #[tokio::test]
    async fn lag_marker_sits_at_the_gap() {
        let inbox = Inbox::new(2);
        assert!(inbox.offer_or_lag(1));
        assert!(inbox.offer_or_lag(2));
        assert!(!inbox.offer_or_lag(3));
        assert!(!inbox.offer_or_lag(4));
        inbox.push(100); // uncounted items always get in
        let got = values(inbox.pop_batch(1).await.unwrap());
        assert_eq!(got, vec!["1"]);
        assert!(inbox.offer_or_lag(5));
        let got = values(inbox.pop_batch(10).await.unwrap());
        assert_eq!(got, vec!["2", "lag2", "100", "5"]);
        assert_eq!(inbox.dropped_total(), 2);
        inbox.close();
        assert!(inbox.pop_batch(10).await.is_none());
    }

    #[tokio::test]
    async fn offer_refuses_when_full() {
        let inbox = Inbox::new(1);
        assert!(inbox.offer(1).is_ok());
        assert_eq!(inbox.offer(2), Err(2));
    }
}
