//! Locks that outlive a panic.

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Locks `m`, taking the data as it is if a holder panicked: every lock in
/// the project guards state that stays consistent between statements (maps
/// and counters updated in one call), so a poisoned lock carries nothing
/// half-written, and refusing it would turn one panic into many.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Reads `l`, as [`lock`] does for a mutex.
pub fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

/// Writes `l`, as [`lock`] does for a mutex.
pub fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}
