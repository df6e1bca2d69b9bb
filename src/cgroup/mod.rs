//! What shmlink knows about cgroups, in one place: the versions and their memory files, where
//! the memory hierarchy is, what a cgroup path says about its container (`path`), where
//! /proc/PID/cgroup puts a process (`proc`), and a memory cgroup's limits (`memory`).

pub mod path;
