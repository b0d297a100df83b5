//! Counting what the loop's open pull requests still ask for (see the [pull loop](super)).

use std::time::Duration;

use tokio::time::Instant;

use crate::wire::HDR_PENDING_MESSAGES;

/// The messages this loop's open pull requests still ask for, summed over all of them.
///
/// Exact while the connection holds: a request adds its batch, every delivery takes one, and a
/// status that ends a request takes what the server says that request had not been given. A
/// request the server fills ends without a status, and the deliveries have already taken its
/// whole batch. Requests lost with a connection end without either; no request outlives its
/// `expires` at the server, so once the newest is older than that (plus a margin) nothing can
/// still be open, and the count starts again from zero.
#[derive(Debug, Default)]
pub(super) struct Requested {
    messages: u64,
    /// When the newest request was sent.
    last_sent: Option<Instant>,
    /// The requests sent within the last `forget_after`, with their batches: no older one can
    /// still be open, so the count is never more than their sum (a request lost without a
    /// status is forgotten even while newer ones keep going out, as the pin's refreshes do).
    recent: std::collections::VecDeque<(Instant, u32)>,
    /// The sum of `recent`'s batches, kept as they come and go: [`Self::expire`] runs at every
    /// delivery, and summing `recent` there cost ~2 instructions a request per delivery (at
    /// 25,000 commands a second and batches of 32, ~1,300 requests within 1.67 s).
    recent_batches: u64,
    /// What the pulls the server may serve still ask for, from the loop's first delivery under a
    /// pin ([`Self::pinned`]) until every pull sent before it has ended (`unpinned_until`): a
    /// consumer pinned to this loop serves the pull it pinned the loop through and those that
    /// carry the pin id, and leaves the others waiting to their expiry
    /// (`tests/tests/pin_facts.rs`, `pulls_without_the_pin_id_wait_once_another_is_pinned`).
    /// Those are not on their way, so not counted by [`Self::wants_pull`]: counted in, the loop
    /// held back until they expired (up to `expires` after a resume's pull, the first of a
    /// pass). A status is taken off it whichever pull it ended (the loop
    /// cannot tell the served pull's from a waiting one's: the server may pin through the
    /// oldest, sent before a pause, which expires just after the resume), so it may undercount
    /// by what the waiting pulls asked for: the loop then pulls early, never late.
    pinned_open: Option<u64>,
    /// When every pull sent before the pin has ended (sent `forget_after` before):
    /// `pinned_open` is dropped then and `messages` counted again.
    unpinned_until: Option<Instant>,
}

impl Requested {
    pub(super) fn sent(&mut self, batch: u32, now: Instant) {
        self.messages += u64::from(batch);
        self.last_sent = Some(now);
        self.recent.push_back((now, batch));
        self.recent_batches += u64::from(batch);
        if let Some(open) = &mut self.pinned_open {
            *open += u64::from(batch);
        }
    }

    pub(super) fn delivered(&mut self) {
        self.messages = self.messages.saturating_sub(1);
        if let Some(open) = &mut self.pinned_open {
            *open = open.saturating_sub(1);
        }
    }

    /// The loop, pinned by none so far, got its first delivery under a pin (before
    /// [`Self::delivered`] counts it): every open pull was sent without the pin id (the last at
    /// `unpinned_sent`), and the server serves the one it pinned the loop through (`batch`),
    /// not the others.
    pub(super) fn pinned(&mut self, batch: u32, unpinned_sent: Instant, forget_after: Duration) {
        self.pinned_open = Some(self.messages.min(u64::from(batch)));
        self.unpinned_until = Some(unpinned_sent + forget_after);
    }

    /// A status ended one request: `pending` is what it had not been given (from the status's
    /// `Nats-Pending-Messages`); a status without one refused the request before delivering
    /// anything (`batch`).
    pub(super) fn ended(&mut self, pending: Option<u64>, batch: u32) {
        let undelivered = pending.unwrap_or(u64::from(batch));
        self.messages = self.messages.saturating_sub(undelivered);
        if let Some(open) = &mut self.pinned_open {
            *open = open.saturating_sub(undelivered);
        }
    }

    /// Forgets requests that cannot be open any more: one sent `forget_after` ago has expired
    /// at the server, answered or lost, so what is still asked for is at most what the newer
    /// ones asked for (a request lost without a status no longer counts once it is that old,
    /// even while the pin's refreshes keep going out).
    pub(super) fn expire(&mut self, now: Instant, forget_after: Duration) {
        while self
            .recent
            .front()
            .is_some_and(|(sent, _)| now >= *sent + forget_after)
        {
            if let Some((_, batch)) = self.recent.pop_front() {
                self.recent_batches -= u64::from(batch);
            }
        }
        self.messages = self.messages.min(self.recent_batches);
        if self.unpinned_until.is_some_and(|until| now >= until) {
            self.unpinned_until = None;
            self.pinned_open = None;
        }
        if let Some(open) = &mut self.pinned_open {
            *open = (*open).min(self.messages);
        }
    }

    /// No request of this loop can still deliver.
    pub(super) fn is_empty(&self) -> bool {
        self.messages == 0
    }

    /// Whether to send another request now: when at most half a batch is still on its way
    /// (asked for; just after a pin, by the pulls the server serves, [`Self::pinned`]); or
    /// when the newest request is `expires` old (the pin lives only on fresh requests).
    pub(super) fn wants_pull(&self, batch: u32, expires: Duration, now: Instant) -> bool {
        let on_their_way = self.pinned_open.unwrap_or(self.messages);
        on_their_way <= u64::from(batch / 2)
            || self.last_sent.is_none_or(|sent| now >= sent + expires)
    }

    /// What the open requests still ask for.
    #[cfg(test)]
    pub(super) fn messages(&self) -> u64 {
        self.messages
    }

    /// When the loop must wake to refresh its pull (running), or to notice that its requests
    /// have all ended (paused).
    pub(super) fn wake_at(
        &self,
        paused: bool,
        expires: Duration,
        forget_after: Duration,
    ) -> Option<Instant> {
        let sent = self.last_sent?;
        match paused {
            false => Some(sent + expires),
            true if self.messages > 0 => Some(sent + forget_after),
            true => None,
        }
    }
}

/// `Nats-Pending-Messages` of a status, if it has one.
pub(super) fn pending_of(headers: Option<&async_nats::HeaderMap>) -> Option<u64> {
    headers?
        .get(async_nats::header::HeaderName::from_static(
            HDR_PENDING_MESSAGES,
        ))?
        .as_str()
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;

    const EXPIRES: Duration = Duration::from_millis(500);

    /// The warm-pass stall : two open requests served in turn, the older expiring
    /// partly served. Counting per request (deliveries taken from the oldest, a status ending
    /// the oldest) left 5 messages counted that nobody would deliver; a few such rounds and
    /// the loop believed half a batch was on its way, and pulled only once per `expires`.
    #[test]
    fn requests_served_in_turn_are_counted_exactly() {
        let now = Instant::now();
        let mut requested = Requested::default();
        requested.sent(10, now); // A
        (0..5).for_each(|_| requested.delivered());
        assert!(requested.wants_pull(10, EXPIRES, now), "half a batch left");
        requested.sent(10, now); // B
        // In turn: A gets 2 more (3 left), B gets 2 (8 left).
        (0..4).for_each(|_| requested.delivered());
        assert!(!requested.wants_pull(10, EXPIRES, now));
        requested.ended(Some(3), 10); // A expires
        assert_eq!(requested.messages, 8, "what B still asks for");
        // A backlog fills B, which ends without a status.
        (0..8).for_each(|_| requested.delivered());
        assert!(requested.is_empty());
        assert!(requested.wants_pull(10, EXPIRES, now));
    }

    /// The count equals the sum of what the server's open requests still ask for, whatever
    /// order they are served and ended in (a pseudo-random schedule of the server's rules).
    #[test]
    fn the_count_follows_the_servers_requests_through_any_schedule() {
        const BATCH: u32 = 16;
        let now = Instant::now();
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut random = move |n: u64| {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (seed >> 33) % n
        };
        let mut requested = Requested::default();
        // The server's waiting queue: what each open request still asks for.
        let mut server: VecDeque<u64> = VecDeque::new();
        for _ in 0..100_000 {
            match random(4) {
                0 if requested.wants_pull(BATCH, EXPIRES, now) => {
                    requested.sent(BATCH, now);
                    server.push_back(u64::from(BATCH));
                }
                1 | 2 => {
                    // A message to the first request, which then goes to the back.
                    if let Some(mut first) = server.pop_front() {
                        first -= 1;
                        requested.delivered();
                        if first > 0 {
                            server.push_back(first);
                        }
                    }
                }
                _ => {
                    // The oldest request expires, or a request is refused outright.
                    if random(2) == 0 {
                        if let Some(oldest) = server.pop_front() {
                            requested.ended(Some(oldest), BATCH);
                        }
                    } else if requested.wants_pull(BATCH, EXPIRES, now) {
                        requested.sent(BATCH, now);
                        requested.ended(None, BATCH);
                    }
                }
            }
            assert_eq!(requested.messages, server.iter().sum::<u64>());
        }
    }

    #[test]
    fn requests_lost_unanswered_are_forgotten_once_they_must_have_expired() {
        let now = Instant::now();
        let forget_after = EXPIRES + Duration::from_secs(1);
        let mut requested = Requested::default();
        assert_eq!(requested.wake_at(true, EXPIRES, forget_after), None);
        requested.sent(10, now);
        assert_eq!(
            requested.wake_at(false, EXPIRES, forget_after),
            Some(now + EXPIRES)
        );
        assert_eq!(
            requested.wake_at(true, EXPIRES, forget_after),
            Some(now + forget_after)
        );
        requested.expire(now + EXPIRES, forget_after);
        assert!(!requested.is_empty());
        assert!(
            requested.wants_pull(10, EXPIRES, now + EXPIRES),
            "stale: refresh the pin"
        );
        requested.expire(now + forget_after, forget_after);
        assert!(requested.is_empty());
        assert_eq!(requested.wake_at(true, EXPIRES, forget_after), None);
    }

    /// A request lost without a status while newer ones keep going out (the pin's refreshes,
    /// one command each while the owner is full): once it must have expired, the count holds
    /// only what the newer requests can still ask for, so the loop does not starve on it.
    #[test]
    fn a_request_lost_among_newer_ones_is_forgotten_once_it_must_have_expired() {
        let now = Instant::now();
        let forget_after = EXPIRES + Duration::from_secs(1);
        let mut requested = Requested::default();
        requested.sent(256, now); // lost with the server's stall: no status ever
        let mut at = now;
        for _ in 0..6 {
            at += EXPIRES;
            requested.expire(at, forget_after);
            requested.sent(1, at);
            let summed: u64 = requested.recent.iter().map(|(_, b)| u64::from(*b)).sum();
            assert_eq!(
                requested.recent_batches, summed,
                "kept as requests come and go"
            );
        }
        requested.expire(at, forget_after);
        assert!(
            requested.messages() <= 4,
            "only the refreshes sent within forget_after: {}",
            requested.messages()
        );
    }

    /// The cold pass's slow start: two pulls without the pin id open when
    /// the consumer is resumed (the loop's refresh and its pull at the resume); the server
    /// pins the loop through one and serves it, the other waits to its expiry. Half the served
    /// pull delivered, the loop pulls again, with the pin id; the waiting one's `408` is taken
    /// off the count too (which pull it ended is not known): the loop pulls early, never late;
    /// once every pull sent before the pin must have ended, `messages` counts again.
    #[test]
    fn pulls_without_the_pin_id_do_not_count_once_another_is_pinned() {
        let now = Instant::now();
        let forget_after = EXPIRES + Duration::from_secs(1);
        let mut requested = Requested::default();
        requested.sent(10, now);
        requested.sent(10, now);
        requested.pinned(10, now, forget_after);
        (0..4).for_each(|_| requested.delivered());
        assert!(!requested.wants_pull(10, EXPIRES, now), "6 on their way");
        requested.delivered();
        assert!(requested.wants_pull(10, EXPIRES, now), "5 on their way");
        requested.sent(10, now); // with the pin id
        assert_eq!(requested.messages(), 25);
        assert!(!requested.is_empty());
        requested.ended(Some(10), 10); // the unserved pull expires
        assert_eq!(requested.messages(), 15);
        assert!(
            requested.wants_pull(10, EXPIRES, now),
            "15 on their way, 5 counted: the status may have been the served pull's"
        );
        requested.sent(10, now);
        assert!(!requested.wants_pull(10, EXPIRES, now), "15 counted");
        (0..5).for_each(|_| requested.delivered());
        assert!(!requested.wants_pull(10, EXPIRES, now), "10 counted");
        (0..5).for_each(|_| requested.delivered());
        assert!(requested.wants_pull(10, EXPIRES, now), "5 counted");
        // Without the 408 (lost with the connection, say), forgotten by `unpinned_until`.
        let mut requested = Requested::default();
        requested.sent(10, now);
        requested.sent(10, now);
        requested.pinned(10, now, forget_after);
        (0..10).for_each(|_| requested.delivered());
        requested.sent(10, now + EXPIRES);
        assert_eq!(
            (requested.pinned_open, requested.messages()),
            (Some(10), 20)
        );
        requested.expire(now + forget_after, forget_after);
        assert_eq!((requested.pinned_open, requested.messages()), (None, 10));
        // Deliveries beyond what is counted are of a pull thought waiting after all: the loop
        // pulls.
        let mut requested = Requested::default();
        requested.sent(10, now);
        requested.sent(10, now);
        requested.pinned(10, now, forget_after);
        (0..15).for_each(|_| requested.delivered());
        assert_eq!((requested.pinned_open, requested.messages()), (Some(0), 5));
        assert!(requested.wants_pull(10, EXPIRES, now));
    }

    /// Seen in the bench's cold pass: the server pinned the loop through its oldest
    /// pull, sent before the pause, which expired just after the resume with 21-26 of its 256
    /// delivered; the pull sent at the resume, without the pin id, then waited to its own
    /// expiry, and the loop, taking the status for that one's, waited ~650 ms for its refresh.
    #[test]
    fn a_status_after_the_pin_is_taken_off_what_the_served_pulls_ask_for() {
        let now = Instant::now();
        let forget_after = EXPIRES + Duration::from_secs(1);
        let mut requested = Requested::default();
        requested.sent(256, now);
        requested.sent(256, now);
        requested.pinned(256, now, forget_after);
        (0..26).for_each(|_| requested.delivered());
        assert!(!requested.wants_pull(256, EXPIRES, now), "230 on their way");
        requested.ended(Some(230), 256); // the served pull's expiry
        assert_eq!(requested.messages(), 256);
        assert!(
            requested.wants_pull(256, EXPIRES, now),
            "nothing on its way"
        );
        requested.sent(256, now); // with the pin id
        assert!(!requested.wants_pull(256, EXPIRES, now), "256 on their way");
        // The pull with the pin id is served; the one without it still waits, not counted: the
        // loop goes on.
        (0..127).for_each(|_| requested.delivered());
        assert!(!requested.wants_pull(256, EXPIRES, now), "129 on their way");
        requested.delivered();
        assert!(requested.wants_pull(256, EXPIRES, now), "128 on their way");
        requested.sent(256, now);
        (0..128).for_each(|_| requested.delivered());
        assert!(!requested.wants_pull(256, EXPIRES, now), "256 on their way");
        // The waiting pull's expiry, taken off the count too: one batch early.
        requested.ended(Some(256), 256);
        assert!(requested.wants_pull(256, EXPIRES, now), "0 counted");
        requested.sent(256, now);
        assert_eq!(
            (requested.pinned_open, requested.messages()),
            (Some(256), 512)
        );
        assert!(!requested.wants_pull(256, EXPIRES, now));
        // Once every pull without the pin id must have ended, counted again.
        let later = now + forget_after;
        requested.expire(later, forget_after);
        requested.sent(256, later);
        (0..100).for_each(|_| requested.delivered());
        assert!(
            !requested.wants_pull(256, EXPIRES, later),
            "156 on their way"
        );
        (0..30).for_each(|_| requested.delivered());
        assert!(
            requested.wants_pull(256, EXPIRES, later),
            "126 on their way"
        );
    }

    #[test]
    fn a_status_names_what_its_request_had_not_been_given() {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(HDR_PENDING_MESSAGES, "7");
        assert_eq!(pending_of(Some(&headers)), Some(7));
        assert_eq!(pending_of(Some(&async_nats::HeaderMap::new())), None);
        assert_eq!(pending_of(None), None);
    }
}
