//! [`LiveList`]: the agent's per-target entries (status, server state, runners) as a list that
//! targets join and leave while readers iterate a copy.

use std::sync::{Arc, RwLock};

/// A list of shared entries that may change at run time. Readers get a copy of the `Arc`s
/// (the lock is held for the copy only), so a reader never blocks a target joining or leaving
/// for longer than that, and an entry a reader holds stays valid after it left the list.
#[derive(Debug)]
pub struct LiveList<T> {
    inner: RwLock<Vec<Arc<T>>>,
}

impl<T> Default for LiveList<T> {
    fn default() -> Self {
        Self {
            inner: RwLock::new(Vec::new()),
        }
    }
}

impl<T> LiveList<T> {
    /// A list holding `items`, in that order.
    pub fn new(items: Vec<Arc<T>>) -> Self {
        Self {
            inner: RwLock::new(items),
        }
    }

    /// A copy of the entries, in the order they joined.
    pub fn snapshot(&self) -> Vec<Arc<T>> {
        match self.inner.read() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Iterates a copy of the entries.
    pub fn iter(&self) -> std::vec::IntoIter<Arc<T>> {
        self.snapshot().into_iter()
    }

    /// The entry at `i` (join order).
    pub fn get(&self, i: usize) -> Option<Arc<T>> {
        self.snapshot().get(i).cloned()
    }

    pub fn len(&self) -> usize {
        match self.inner.read() {
            Ok(g) => g.len(),
            Err(p) => p.into_inner().len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends `item`.
    pub fn push(&self, item: Arc<T>) {
        match self.inner.write() {
            Ok(mut g) => g.push(item),
            Err(p) => p.into_inner().push(item),
        }
    }

    /// Removes every entry for which `gone` is true; returns how many left.
    pub fn remove_where(&self, mut gone: impl FnMut(&T) -> bool) -> usize {
        let mut g = match self.inner.write() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let before = g.len();
        g.retain(|t| !gone(t));
        before - g.len()
    }
}

impl<T> IntoIterator for &LiveList<T> {
    type Item = Arc<T>;
    type IntoIter = std::vec::IntoIter<Arc<T>>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readers_keep_their_copy_while_entries_leave() {
        let l = LiveList::new(vec![Arc::new(1), Arc::new(2)]);
        let copy = l.snapshot();
        l.push(Arc::new(3));
        assert_eq!(l.remove_where(|v| *v == 1), 1);
        assert_eq!(*copy[0], 1, "a reader's copy stays valid");
        assert_eq!(l.iter().map(|v| *v).collect::<Vec<_>>(), [2, 3]);
        assert_eq!(l.get(1).map(|v| *v), Some(3));
        assert_eq!(l.remove_where(|v| *v == 9), 0);
        assert_eq!(l.len(), 2);
    }
}
