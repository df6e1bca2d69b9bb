use super::*;

fn limits() -> Limits {
    Limits {
        max_connections: 4,
        per_client: 2,
        probe_reserve: 2,
        probe_reserve_per_client: 1,
        probe_paths: PROBE_PATHS,
        first_request: Duration::from_secs(5),
        header_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(10),
        request_timeout: Duration::from_secs(30),
        lifetime: Some(Duration::from_secs(60)),
        grace: Duration::from_secs(5),
        h2_max_streams: 8,
        h2_window: 65_535,
        max_buf: 64 << 10,
        http2: false,
    }
}

fn client(last: u8) -> Client {
    Client::of(IpAddr::from([10, 0, 0, last]))
}

#[test]
fn a_client_past_its_share_gets_a_probe_slot_then_nothing_and_slots_come_back() {
    let gate = Gate::new(limits());
    let a1 = gate.admit(client(1)).unwrap();
    let a2 = gate.admit(client(1)).unwrap();
    assert_eq!((a1.slot, a2.slot), (Slot::Normal, Slot::Normal));
    // Past its share: one connection of the probes' reserve, then refused.
    let a3 = gate.admit(client(1)).unwrap();
    assert_eq!(a3.slot, Slot::Probe);
    assert_eq!(gate.admit(client(1)).unwrap_err(), Dropped::PerClient);
    // Others still get theirs.
    let b1 = gate.admit(client(2)).unwrap();
    let b2 = gate.admit(client(2)).unwrap();
    assert_eq!((b1.slot, b2.slot), (Slot::Normal, Slot::Normal));
    assert_eq!(gate.held(), (4, 1));
    // Every normal slot held: a new client gets the reserve's last, then none.
    let c1 = gate.admit(client(3)).unwrap();
    assert_eq!(c1.slot, Slot::Probe);
    assert_eq!(gate.admit(client(4)).unwrap_err(), Dropped::Full);
    // Given back on drop, the client's share too.
    drop((a1, a3));
    assert_eq!(gate.held(), (3, 1));
    assert_eq!(gate.admit(client(1)).unwrap().slot, Slot::Normal);
    drop((a2, b1, b2, c1));
    assert_eq!(gate.held(), (0, 0));
    assert!(
        gate.held.lock().unwrap().1.is_empty(),
        "no client left behind"
    );
}

#[test]
fn clients_are_counted_by_ipv4_address_or_ipv6_prefix() {
    let v6 = |s: &str| Client::of(s.parse().unwrap());
    assert_eq!(v6("2001:db8:1:2:aaaa::1"), v6("2001:db8:1:2:bbbb::9"));
    assert_ne!(v6("2001:db8:1:2::1"), v6("2001:db8:1:3::1"));
    assert_eq!(v6("::ffff:10.0.0.7"), client(7));
    assert_eq!(v6("::1"), Client("::1".parse().unwrap()));
}

#[test]
fn the_pods_own_loopback_has_no_share_only_the_totals() {
    let gate = Gate::new(limits());
    let local = Client::of(IpAddr::from([127, 0, 0, 1]));
    assert!(!local.has_share() && !Client::of("::1".parse().unwrap()).has_share());
    assert!(Client::of(IpAddr::from([127, 0, 0, 2])).has_share());
    let held: Vec<Ticket> = (0..6).map(|_| gate.admit(local).unwrap()).collect();
    let slots: Vec<Slot> = held.iter().map(|t| t.slot).collect();
    assert_eq!(
        slots,
        [[Slot::Normal; 4].as_slice(), &[Slot::Probe; 2]].concat()
    );
    assert_eq!(gate.admit(local).unwrap_err(), Dropped::Full);
}

#[test]
fn a_connection_without_a_request_is_dropped_at_its_first_deadline() {
    let l = limits();
    let t0 = Instant::now();
    let a = Activity::new(t0);
    assert_eq!(judge(&a, t0, &l), Verdict::Wait(t0 + l.first_request));
    assert_eq!(
        judge(&a, t0 + l.first_request, &l),
        Verdict::Drop(Dropped::NoRequest)
    );
}

#[test]
fn a_request_in_flight_is_timed_from_its_head_and_an_idle_connection_closed() {
    let l = limits();
    let t0 = Instant::now();
    let mut a = Activity::new(t0);
    let s = Duration::from_secs;
    let first = a.begin(t0 + s(1));
    // In flight: neither the first deadline nor idleness applies; the request's own does.
    assert_eq!(judge(&a, t0 + s(20), &l), Verdict::Wait(t0 + s(31)));
    assert_eq!(
        judge(&a, t0 + s(31), &l),
        Verdict::Drop(Dropped::RequestTimeout)
    );
    // Two at once (HTTP/2): the oldest decides.
    let second = a.begin(t0 + s(2));
    a.end(first, t0 + s(3));
    assert_eq!(judge(&a, t0 + s(3), &l), Verdict::Wait(t0 + s(32)));
    a.end(second, t0 + s(4));
    // Idle since its last answer ended.
    assert_eq!(judge(&a, t0 + s(5), &l), Verdict::Wait(t0 + s(14)));
    assert_eq!(judge(&a, t0 + s(14), &l), Verdict::Close);
}

#[test]
fn a_busy_connection_still_ends_at_its_lifetime() {
    let l = limits();
    let t0 = Instant::now();
    let mut a = Activity::new(t0);
    let s = Duration::from_secs;
    a.begin(t0 + s(50));
    assert_eq!(judge(&a, t0 + s(55), &l), Verdict::Wait(t0 + s(60)));
    assert_eq!(judge(&a, t0 + s(60), &l), Verdict::Close);
    let never = Limits {
        lifetime: None,
        ..l
    };
    assert_eq!(judge(&a, t0 + s(60), &never), Verdict::Wait(t0 + s(80)));
}
