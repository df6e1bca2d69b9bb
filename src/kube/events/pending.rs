//! Pure: what waits to be published, and what has been. Repeats of one Event merge into one
//! pending entry; entries are taken a target (the object an Event regards) at a time, round
//! robin, so a Pod that fails a hundred times a second gets one call per round like every other
//! object; within a target, first Events go before series updates. An `Ended` needs no call and
//! is never dropped. The publishing task (`publisher.rs`) makes the calls and reports back.

use std::collections::{HashMap, VecDeque};

use k8s_openapi::api::core::v1::ObjectReference;

use super::{EventMsg, EventSpec};

/// Who an Event regards: turns are taken by this.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Target {
    Node,
    /// By UID, or `namespace/name` when the reference has none.
    Object(String),
}

impl Target {
    fn of(regarding: &ObjectReference) -> Target {
        if regarding.kind.as_deref() == Some("Node") {
            return Target::Node;
        }
        match &regarding.uid {
            Some(uid) => Target::Object(uid.clone()),
            None => Target::Object(format!(
                "{}/{}",
                regarding.namespace.as_deref().unwrap_or(""),
                regarding.name.as_deref().unwrap_or("")
            )),
        }
    }
}

/// Occurrences of one Event not yet published.
#[derive(Debug)]
struct Entry {
    target: Target,
    /// The newest: its note is the one published.
    spec: Box<EventSpec>,
    occurrences: i32,
    /// Its condition is over: forget the Event once this is published.
    ended: bool,
}

/// An Event created, and how many occurrences its series counts.
#[derive(Debug)]
struct Created {
    namespace: String,
    name: String,
    /// Occurrences published, and those dropped from the queue since, which the next update
    /// counts.
    count: i32,
}

/// One API call to make.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Call {
    pub spec: EventSpec,
    pub kind: CallKind,
}

#[derive(Debug, Clone, PartialEq)]
pub(super) enum CallKind {
    /// Create the Event; a `count` above 1 is created with a series of that count.
    Create { count: i32 },
    /// Set the series of the Event `namespace`/`name` to `count`.
    Update {
        namespace: String,
        name: String,
        count: i32,
    },
}

/// How the call taken last went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Finished {
    /// Created (or already there: 409) in `namespace`.
    Created {
        namespace: String,
    },
    Updated,
    /// The Event expired: the next occurrence creates it anew.
    Gone,
    /// Refused for good; what it carried is lost.
    Rejected,
}

/// What became of one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pushed {
    Queued,
    /// Into the pending entry of the same Event.
    Merged,
    /// `Ended` of an Event with nothing pending: forgotten now.
    Forgotten,
    /// `Ended` of an Event with a publish pending or under way: forgotten once it is out.
    EndsAfterPublish,
    /// The queue was full: the pending update of the Event with this id was dropped to make
    /// room (its occurrences go with that Event's next update).
    DroppedPending(u64),
    /// The queue was full of first Events: this one was dropped.
    DroppedIncoming,
}

impl Pushed {
    pub fn dropped(self) -> bool {
        matches!(self, Pushed::DroppedPending(_) | Pushed::DroppedIncoming)
    }
}

/// The entry taken by the publishing task, until it reports how the call went.
#[derive(Debug)]
struct InFlight {
    id: u64,
    entry: Entry,
}

/// Pending entries, turns, and the Events created.
#[derive(Debug)]
pub(super) struct Pending {
    /// At most this many distinct Events waiting (the one under way included).
    capacity: usize,
    entries: HashMap<u64, Entry>,
    /// Each target's pending ids, in arrival order.
    queues: HashMap<Target, Vec<u64>>,
    /// Targets with pending ids, each once, in turn order.
    turns: VecDeque<Target>,
    in_flight: Option<InFlight>,
    created: HashMap<u64, Created>,
    closed: bool,
}

impl Pending {
    pub fn new(capacity: usize) -> Pending {
        Pending {
            capacity,
            entries: HashMap::new(),
            queues: HashMap::new(),
            turns: VecDeque::new(),
            in_flight: None,
            created: HashMap::new(),
            closed: false,
        }
    }

    /// Every sender is gone: the task publishes what is left, then ends.
    pub fn close(&mut self) {
        self.closed = true;
    }

    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Events remembered for their series.
    pub fn created_len(&self) -> usize {
        self.created.len()
    }

    /// Distinct Events waiting, the one under way included.
    pub fn len(&self) -> usize {
        let in_flight_apart = self
            .in_flight
            .as_ref()
            .is_some_and(|f| !self.entries.contains_key(&f.id));
        self.entries.len() + usize::from(in_flight_apart)
    }

    pub fn push(&mut self, msg: EventMsg) -> Pushed {
        match msg {
            EventMsg::Ended(id) => self.end(id),
            EventMsg::Publish(spec) => self.publish(spec),
        }
    }

    fn end(&mut self, id: u64) -> Pushed {
        if let Some(e) = self.entries.get_mut(&id) {
            e.ended = true;
            return Pushed::EndsAfterPublish;
        }
        if let Some(f) = self.in_flight.as_mut().filter(|f| f.id == id) {
            f.entry.ended = true;
            return Pushed::EndsAfterPublish;
        }
        self.created.remove(&id);
        Pushed::Forgotten
    }

    fn publish(&mut self, spec: Box<EventSpec>) -> Pushed {
        let id = spec.id;
        if let Some(e) = self.entries.get_mut(&id) {
            e.spec = spec;
            e.occurrences = e.occurrences.saturating_add(1);
            return Pushed::Merged;
        }
        // A repeat of the Event under way takes no room of its own.
        let under_way = self.in_flight.as_ref().is_some_and(|f| f.id == id);
        let mut pushed = Pushed::Queued;
        if !under_way && self.len() >= self.capacity {
            match self.victim() {
                Some(victim) => {
                    self.drop_pending(victim);
                    pushed = Pushed::DroppedPending(victim);
                }
                None => return Pushed::DroppedIncoming,
            }
        }
        let target = Target::of(&spec.regarding);
        let queue = self.queues.entry(target.clone()).or_default();
        if queue.is_empty() {
            self.turns.push_back(target.clone());
        }
        queue.push(id);
        self.entries.insert(
            id,
            Entry {
                target,
                spec,
                occurrences: 1,
                ended: false,
            },
        );
        pushed
    }

    /// A stored series sent again after a restart: created with `assigned` occurrences, or,
    /// when the API server had confirmed `confirmed` of them, its series set to `assigned`.
    pub fn resume(&mut self, spec: EventSpec, assigned: i32, confirmed: i32) -> Pushed {
        let id = spec.id;
        if confirmed > 0 {
            let created = Created {
                namespace: spec.regarding.namespace.clone().unwrap_or_default(),
                name: spec.name.clone(),
                count: confirmed,
            };
            self.created.insert(id, created);
        }
        let pushed = self.publish(Box::new(spec));
        if let Some(e) = self.entries.get_mut(&id) {
            e.occurrences = assigned.saturating_sub(confirmed).max(1);
        }
        pushed
    }

    /// The pending series update to drop for room: of an Event already created (its update can
    /// wait for its next repeat), on the target holding the most pending entries (the first in
    /// turn order among equals), its newest such. None when every pending entry is a first
    /// Event.
    fn victim(&self) -> Option<u64> {
        let mut best: Option<(usize, u64)> = None;
        for target in &self.turns {
            let Some(ids) = self.queues.get(target) else {
                continue;
            };
            if best.is_some_and(|(len, _)| ids.len() <= len) {
                continue;
            }
            if let Some(id) = ids.iter().rev().find(|id| self.created.contains_key(id)) {
                best = Some((ids.len(), *id));
            }
        }
        best.map(|(_, id)| id)
    }

    fn drop_pending(&mut self, id: u64) {
        let Some(entry) = self.remove_entry(id) else {
            return;
        };
        if entry.ended {
            self.created.remove(&id);
        } else if let Some(c) = self.created.get_mut(&id) {
            c.count = c.count.saturating_add(entry.occurrences);
        }
    }

    /// Out of the pending entries, its target's queue and, if that empties, the turns.
    fn remove_entry(&mut self, id: u64) -> Option<Entry> {
        let entry = self.entries.remove(&id)?;
        if let Some(ids) = self.queues.get_mut(&entry.target) {
            ids.retain(|i| *i != id);
            if ids.is_empty() {
                self.queues.remove(&entry.target);
                self.turns.retain(|t| *t != entry.target);
            }
        }
        Some(entry)
    }

    /// The next call: the next target in turn, its first pending first Event, else its oldest
    /// update. The entry is under way until [`Pending::finish`].
    pub fn take(&mut self) -> Option<Call> {
        if self.in_flight.is_some() {
            return self.call();
        }
        while let Some(target) = self.turns.pop_front() {
            let Some(ids) = self.queues.get_mut(&target) else {
                continue;
            };
            let at = ids
                .iter()
                .position(|id| !self.created.contains_key(id))
                .unwrap_or(0);
            if at >= ids.len() {
                self.queues.remove(&target);
                continue;
            }
            let id = ids.remove(at);
            if ids.is_empty() {
                self.queues.remove(&target);
            } else {
                self.turns.push_back(target);
            }
            let Some(entry) = self.entries.remove(&id) else {
                continue;
            };
            self.in_flight = Some(InFlight { id, entry });
            return self.call();
        }
        None
    }

    /// The call under way again, after a failure: with what was sent for it since.
    pub fn retry(&mut self) -> Option<Call> {
        let id = self.in_flight.as_ref()?.id;
        if let Some(newer) = self.remove_entry(id) {
            if let Some(f) = self.in_flight.as_mut() {
                f.entry.spec = newer.spec;
                f.entry.occurrences = f.entry.occurrences.saturating_add(newer.occurrences);
                f.entry.ended |= newer.ended;
            }
        }
        self.call()
    }

    fn call(&self) -> Option<Call> {
        let f = self.in_flight.as_ref()?;
        let n = f.entry.occurrences;
        let kind = match self.created.get(&f.id) {
            Some(c) => CallKind::Update {
                namespace: c.namespace.clone(),
                name: c.name.clone(),
                count: c.count.saturating_add(n),
            },
            None => CallKind::Create { count: n },
        };
        Some(Call {
            spec: (*f.entry.spec).clone(),
            kind,
        })
    }

    /// How the call under way went.
    pub fn finish(&mut self, finished: Finished) {
        let Some(InFlight { id, entry }) = self.in_flight.take() else {
            return;
        };
        if entry.ended {
            self.created.remove(&id);
            return;
        }
        match finished {
            Finished::Created { namespace } => {
                let created = Created {
                    namespace,
                    name: entry.spec.name,
                    count: entry.occurrences,
                };
                self.created.insert(id, created);
            }
            // Added, not set: occurrences dropped while this was under way count too.
            Finished::Updated => {
                if let Some(c) = self.created.get_mut(&id) {
                    c.count = c.count.saturating_add(entry.occurrences);
                }
            }
            Finished::Gone => {
                self.created.remove(&id);
            }
            Finished::Rejected => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::events::{pod_ref, EventType};
    use crate::model::EventReason;

    fn spec(id: u64, pod: &str, note: &str) -> Box<EventSpec> {
        Box::new(EventSpec {
            id,
            name: format!("{pod}.shmlink.1.{id:x}"),
            regarding: pod_ref("ml", pod, &format!("uid-{pod}")),
            reason: EventReason::ShmBusError,
            type_: EventType::Warning,
            note: note.into(),
        })
    }

    fn node_spec(id: u64) -> Box<EventSpec> {
        Box::new(EventSpec {
            id,
            name: format!("node-a.shmlink.1.{id:x}"),
            regarding: ObjectReference {
                kind: Some("Node".into()),
                name: Some("node-a".into()),
                ..ObjectReference::default()
            },
            reason: EventReason::GpuLinkDown,
            type_: EventType::Warning,
            note: "GPU 7".into(),
        })
    }

    fn publish(p: &mut Pending, id: u64, pod: &str) -> Pushed {
        p.push(EventMsg::Publish(spec(id, pod, &format!("note {id}"))))
    }

    /// Takes one call and reports it done: (id, kind).
    fn deliver(p: &mut Pending) -> Option<(u64, CallKind)> {
        let call = p.take()?;
        let finished = match &call.kind {
            CallKind::Create { .. } => Finished::Created {
                namespace: "ml".into(),
            },
            CallKind::Update { .. } => Finished::Updated,
        };
        p.finish(finished);
        Some((call.spec.id, call.kind))
    }

    fn deliver_all(p: &mut Pending) -> Vec<(u64, CallKind)> {
        std::iter::from_fn(|| deliver(p)).collect()
    }

    fn create(count: i32) -> CallKind {
        CallKind::Create { count }
    }

    fn update(pod: &str, id: u64, count: i32) -> CallKind {
        CallKind::Update {
            namespace: "ml".into(),
            name: format!("{pod}.shmlink.1.{id:x}"),
            count,
        }
    }

    #[test]
    fn repeats_merge_into_one_call_with_the_newest_note_and_every_occurrence() {
        let mut p = Pending::new(8);
        assert_eq!(publish(&mut p, 1, "a"), Pushed::Queued);
        for n in 0..4 {
            let pushed = p.push(EventMsg::Publish(spec(1, "a", &format!("again {n}"))));
            assert_eq!(pushed, Pushed::Merged);
        }
        assert_eq!(p.len(), 1);
        let call = p.take().unwrap();
        assert_eq!(call.kind, create(5), "created with its series");
        assert_eq!(call.spec.note, "again 3");
        p.finish(Finished::Created {
            namespace: "ml".into(),
        });
        assert_eq!(p.take(), None);

        // Three more: one update to 5 + 3.
        for _ in 0..3 {
            publish(&mut p, 1, "a");
        }
        assert_eq!(deliver_all(&mut p), vec![(1, update("a", 1, 8))]);
    }

    #[test]
    fn targets_take_turns_so_a_flood_gets_one_call_per_round() {
        let mut p = Pending::new(64);
        publish(&mut p, 1, "noisy");
        deliver(&mut p);
        for i in 0..10 {
            publish(&mut p, 1, "noisy");
            publish(&mut p, 100 + i, &format!("pod-{i}"));
            publish(&mut p, 1, "noisy");
        }
        let calls = deliver_all(&mut p);
        assert_eq!(calls.len(), 11, "the 20 repeats are one update");
        assert_eq!(calls[0], (1, update("noisy", 1, 21)));
        for (i, (id, kind)) in calls[1..].iter().enumerate() {
            assert_eq!((*id, kind), (100 + i as u64, &create(1)));
        }

        // Repeats keep coming while five others wait: one call for the flood in their round.
        publish(&mut p, 1, "noisy");
        for i in 0..5 {
            publish(&mut p, 200 + i, &format!("other-{i}"));
        }
        let mut round = Vec::new();
        for _ in 0..6 {
            let (id, _) = deliver(&mut p).unwrap();
            round.push(id);
            publish(&mut p, 1, "noisy");
        }
        round.sort();
        assert_eq!(round, vec![1, 200, 201, 202, 203, 204]);
        assert_eq!(deliver_all(&mut p), vec![(1, update("noisy", 1, 28))]);
    }

    #[test]
    fn within_a_target_first_events_go_before_updates() {
        let mut p = Pending::new(8);
        publish(&mut p, 1, "a");
        deliver(&mut p);
        publish(&mut p, 1, "a");
        publish(&mut p, 2, "a");
        publish(&mut p, 3, "a");
        let order: Vec<u64> = deliver_all(&mut p).into_iter().map(|(id, _)| id).collect();
        assert_eq!(order, vec![2, 3, 1]);
    }

    #[test]
    fn the_node_is_a_target_like_any_pod() {
        let mut p = Pending::new(8);
        for id in 1..=3 {
            p.push(EventMsg::Publish(node_spec(id)));
        }
        publish(&mut p, 10, "a");
        let order: Vec<u64> = deliver_all(&mut p).into_iter().map(|(id, _)| id).collect();
        assert_eq!(order, vec![1, 10, 2, 3]);
    }

    #[test]
    fn ended_with_nothing_pending_is_forgotten_at_once() {
        let mut p = Pending::new(8);
        publish(&mut p, 1, "a");
        deliver(&mut p);
        assert_eq!(p.created_len(), 1);
        assert_eq!(p.push(EventMsg::Ended(1)), Pushed::Forgotten);
        assert_eq!(p.created_len(), 0);
        // Its next occurrence would be created anew.
        publish(&mut p, 1, "a");
        assert_eq!(deliver_all(&mut p), vec![(1, create(1))]);
    }

    #[test]
    fn ended_with_a_publish_pending_goes_out_first_then_is_forgotten() {
        let mut p = Pending::new(8);
        publish(&mut p, 1, "a");
        deliver(&mut p);
        publish(&mut p, 1, "a");
        assert_eq!(p.push(EventMsg::Ended(1)), Pushed::EndsAfterPublish);
        assert_eq!(p.created_len(), 1);
        assert_eq!(deliver_all(&mut p), vec![(1, update("a", 1, 2))]);
        assert_eq!(p.created_len(), 0);

        // Ended while the create is under way: not remembered when it is done.
        publish(&mut p, 2, "b");
        let call = p.take().unwrap();
        assert_eq!(call.kind, create(1));
        assert_eq!(p.push(EventMsg::Ended(2)), Pushed::EndsAfterPublish);
        p.finish(Finished::Created {
            namespace: "ml".into(),
        });
        assert_eq!(p.created_len(), 0);
    }

    #[test]
    fn ended_is_never_dropped_even_when_full() {
        let mut p = Pending::new(1);
        publish(&mut p, 1, "a");
        deliver(&mut p);
        publish(&mut p, 2, "b");
        assert_eq!(publish(&mut p, 3, "c"), Pushed::DroppedIncoming);
        assert_eq!(p.push(EventMsg::Ended(1)), Pushed::Forgotten);
        assert_eq!(p.push(EventMsg::Ended(2)), Pushed::EndsAfterPublish);
        assert_eq!(deliver_all(&mut p), vec![(2, create(1))]);
        assert_eq!(p.created_len(), 0);
    }

    #[test]
    fn full_of_first_events_the_incoming_one_is_dropped() {
        let mut p = Pending::new(2);
        let pushed: Vec<Pushed> = (1..=10).map(|id| publish(&mut p, id, "a")).collect();
        assert_eq!(&pushed[..2], &[Pushed::Queued, Pushed::Queued]);
        assert!(pushed[2..].iter().all(|p| *p == Pushed::DroppedIncoming));
        // The one under way counts against the capacity; its repeats take no room.
        assert_eq!(p.take().unwrap().spec.id, 1);
        assert_eq!(publish(&mut p, 11, "b"), Pushed::DroppedIncoming);
        assert_eq!(publish(&mut p, 1, "a"), Pushed::Queued);
        assert_eq!(p.len(), 2);
    }

    #[test]
    fn full_a_pending_update_of_the_busiest_target_makes_room_and_counts_later() {
        let mut p = Pending::new(4);
        for (id, pod) in [(1, "a"), (2, "b"), (3, "b")] {
            publish(&mut p, id, pod);
        }
        deliver_all(&mut p);
        // b holds two updates, a one; then a first Event fills the queue.
        publish(&mut p, 1, "a");
        publish(&mut p, 2, "b");
        publish(&mut p, 2, "b");
        publish(&mut p, 3, "b");
        publish(&mut p, 4, "c");
        assert_eq!(p.len(), 4);
        assert_eq!(publish(&mut p, 5, "d"), Pushed::DroppedPending(3));
        // a and b hold one update each: a is first in turn order.
        assert_eq!(publish(&mut p, 6, "d"), Pushed::DroppedPending(1));
        // d holds two, but first Events only.
        assert_eq!(publish(&mut p, 7, "e"), Pushed::DroppedPending(2));
        assert_eq!(publish(&mut p, 8, "e"), Pushed::DroppedIncoming);
        assert_eq!(p.len(), 4);

        let mut calls = deliver_all(&mut p);
        calls.sort_by_key(|(id, _)| *id);
        let ids: Vec<u64> = calls.iter().map(|(id, _)| *id).collect();
        assert_eq!(ids, vec![4, 5, 6, 7]);
        // The dropped occurrences are counted by the next update.
        publish(&mut p, 2, "b");
        assert_eq!(deliver_all(&mut p), vec![(2, update("b", 2, 1 + 2 + 1))]);
    }

    #[test]
    fn a_dropped_update_of_an_ended_event_forgets_it() {
        let mut p = Pending::new(1);
        publish(&mut p, 1, "a");
        deliver(&mut p);
        publish(&mut p, 1, "a");
        p.push(EventMsg::Ended(1));
        assert_eq!(publish(&mut p, 2, "b"), Pushed::DroppedPending(1));
        assert_eq!(p.created_len(), 0);
    }

    #[test]
    fn a_retry_keeps_the_entry_under_way_and_takes_in_what_came_since() {
        let mut p = Pending::new(8);
        publish(&mut p, 1, "a");
        publish(&mut p, 2, "b");
        assert_eq!(p.take().unwrap().kind, create(1));
        publish(&mut p, 1, "a");
        p.push(EventMsg::Publish(spec(1, "a", "newest")));
        assert_eq!(p.len(), 2, "its repeats take no room of their own");
        let call = p.retry().unwrap();
        assert_eq!((call.spec.id, &call.kind), (1, &create(3)));
        assert_eq!(call.spec.note, "newest");
        assert_eq!(p.take(), Some(call), "still the one under way");
        p.finish(Finished::Created {
            namespace: "ml".into(),
        });
        assert_eq!(deliver_all(&mut p), vec![(2, create(1))]);
    }

    #[test]
    fn a_resumed_series_is_created_whole_or_set_to_its_assigned_count() {
        let mut p = Pending::new(8);
        p.resume(*spec(1, "a", "n"), 3, 0);
        p.resume(*spec(2, "b", "n"), 5, 4);
        let mut calls = deliver_all(&mut p);
        calls.sort_by_key(|(id, _)| *id);
        assert_eq!(calls, vec![(1, create(3)), (2, update("b", 2, 5))]);
        // The next failure on either counts one more.
        publish(&mut p, 1, "a");
        publish(&mut p, 2, "b");
        let mut calls = deliver_all(&mut p);
        calls.sort_by_key(|(id, _)| *id);
        assert_eq!(calls, vec![(1, update("a", 1, 4)), (2, update("b", 2, 6))]);
    }

    #[test]
    fn gone_forgets_and_rejected_keeps_what_was_created() {
        let mut p = Pending::new(8);
        publish(&mut p, 1, "a");
        publish(&mut p, 2, "b");
        deliver_all(&mut p);
        publish(&mut p, 1, "a");
        p.take();
        p.finish(Finished::Gone);
        publish(&mut p, 2, "b");
        p.take();
        p.finish(Finished::Rejected);
        assert_eq!(p.created_len(), 1);
        publish(&mut p, 1, "a");
        publish(&mut p, 2, "b");
        let mut calls = deliver_all(&mut p);
        calls.sort_by_key(|(id, _)| *id);
        assert_eq!(calls, vec![(1, create(1)), (2, update("b", 2, 2))]);
    }
}
