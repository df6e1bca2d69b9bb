//! What `serve` goes on with from the state store: the follower's checkpoint (log and kernel
//! positions, deaths told), the Pod-status deaths told, the failure Event series left open and
//! the counts the API server confirmed of them. Without a store: nothing, as a first start.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use serde::de::DeserializeOwned;

use super::cluster::KubeResume;
use crate::failures::checkpoint::{self, Checkpoint};
use crate::failures::sources::Resume;
use crate::kube::events::{CONFIRMED_KEY, SERIES_KEY};
use crate::kube::exits::Exits;
use crate::model::Failure;
use crate::state::{self, Filter, Store};

/// How far back the told failures are remembered at a restart: well past `same::WINDOW`, the
/// most two sources' times of one death differ.
const TOLD_LATELY: Duration = Duration::from_secs(600);

/// The follower's start and the cluster side's.
pub(super) fn resumes(store: Option<&Store>) -> (Option<Resume>, KubeResume) {
    let Some(store) = store else {
        return (None, fresh_kube());
    };
    let saved = store.get(checkpoint::KEY).and_then(Checkpoint::from_stored);
    let exits = match &saved {
        Some(c) => Exits::resume(c.at, c.pod_exits.clone()),
        None => Exits::new(SystemTime::now()),
    };
    let kube = KubeResume {
        exits,
        series: stored(store, SERIES_KEY).unwrap_or_default(),
        confirmed: stored::<HashMap<String, i32>>(store, CONFIRMED_KEY).unwrap_or_default(),
        store: Some(store.sender()),
    };
    let resume = Resume {
        saved,
        boot_changed: store.boot_changed(),
        told: told_lately(store),
    };
    (Some(resume), kube)
}

/// The failures stored with a time within the last [`TOLD_LATELY`] (at most 1,024, the newest).
fn told_lately(store: &Store) -> Vec<Failure> {
    let filter = Filter {
        since: SystemTime::now().checked_sub(TOLD_LATELY),
        limit: 1024,
        ..Filter::default()
    };
    match state::read_failures(store.dir(), &filter) {
        Ok(told) => {
            tracing::info!(
                failures = told.len(),
                "the failures told in the last 10 minutes are remembered as told"
            );
            told
        }
        Err(e) => {
            tracing::warn!("{e}; deaths told just before the restart are not remembered");
            Vec::new()
        }
    }
}

fn fresh_kube() -> KubeResume {
    KubeResume {
        exits: Exits::new(SystemTime::now()),
        series: Vec::new(),
        confirmed: HashMap::new(),
        store: None,
    }
}

/// A stored value of `key`; None (said) when it does not read as this agent writes it.
pub(super) fn stored<T: DeserializeOwned>(store: &Store, key: &str) -> Option<T> {
    let value = store.get(key)?;
    T::deserialize(value)
        .map_err(|e| tracing::warn!(key, "stored state not readable ({e}); not resumed"))
        .ok()
}
