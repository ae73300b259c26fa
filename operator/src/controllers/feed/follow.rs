//! Applying one watch's events to the index, the same way for every kind
//! listed as a whole (the Secrets, watched one by one, have their own loop).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use futures::{Stream, StreamExt};
use kube::Resource;
use kube::runtime::watcher::{self, Event};

use crate::controllers::LIST_PAGE;
use crate::index::Index;

/// The index as the feeds share it.
pub(super) type Shared = Arc<Mutex<Index>>;

pub(super) fn lock(index: &Shared) -> std::sync::MutexGuard<'_, Index> {
    index
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// How the feeds list: in pages of `LIST_PAGE`.
pub(super) fn list_config() -> watcher::Config {
    watcher::Config::default().page_size(LIST_PAGE)
}

/// Applies a watch's events. After a re-list, objects that were not listed
/// again are deleted: their delete events fell in the gap.
pub(super) async fn follow<K, S>(
    stream: S,
    mut apply: impl FnMut(&K),
    mut delete: impl FnMut(&str, &str),
    mut listed: impl FnMut(),
) where
    K: Resource,
    K::DynamicType: Default,
    S: Stream<Item = Result<Event<K>, watcher::Error>>,
{
    let mut known: HashSet<(String, String)> = HashSet::new();
    let mut relisted: Option<HashSet<(String, String)>> = None;
    let key = |o: &K| {
        (
            o.meta().namespace.clone().unwrap_or_default(),
            o.meta().name.clone().unwrap_or_default(),
        )
    };
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(Event::Apply(o)) => {
                known.insert(key(&o));
                apply(&o);
            }
            Ok(Event::InitApply(o)) => {
                if let Some(r) = relisted.as_mut() {
                    r.insert(key(&o));
                }
                known.insert(key(&o));
                apply(&o);
            }
            Ok(Event::Delete(o)) => {
                let (ns, name) = key(&o);
                known.remove(&(ns.clone(), name.clone()));
                delete(&ns, &name);
            }
            Ok(Event::Init) => relisted = Some(HashSet::new()),
            Ok(Event::InitDone) => {
                if let Some(now) = relisted.take() {
                    for (ns, name) in known.difference(&now) {
                        delete(ns, name);
                    }
                    known = now;
                }
                listed();
            }
            Err(e) => crate::errors::log_watch_error(&K::kind(&Default::default()), &e),
        }
    }
}
