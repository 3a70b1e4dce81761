//! `kill -9` of a rank process: the other rank processes fail within a second with an error
//! naming it, and exit cleanly. The ranks are this test binary run again (the ignored
//! `rank_process` test), with torchrun's environment.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use roce_collectives::{Communicator, ReduceOp};

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default()
}

#[test]
#[ignore = "a rank process, started by kill_9_of_a_rank_process_fails_the_others_within_a_second"]
fn rank_process() {
    if std::env::var_os("COLL_KILL9_CHILD").is_none() {
        return;
    }
    let c = Communicator::from_env().expect("init");
    let mut v = vec![1f32; 1 << 16];
    c.allreduce_in_place(&mut v, ReduceOp::Sum)
        .expect("first allreduce");
    println!("COLL: ready");
    loop {
        v.fill(1.0);
        if let Err(e) = c.allreduce_in_place(&mut v, ReduceOp::Sum) {
            println!("COLL: failed {} {e}", now_ns());
            return;
        }
    }
}

#[test]
fn kill_9_of_a_rank_process_fails_the_others_within_a_second() {
    let n = 3;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let me = std::env::current_exe().expect("the test binary");
    let block = 100 + (std::process::id() % 100) as u8;
    let (tx, rx) = mpsc::channel::<(usize, String)>();
    let mut children: Vec<Child> = (0..n)
        .map(|rank| {
            let mut c = Command::new(&me)
                .args([
                    "--ignored",
                    "--exact",
                    "rank_process",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("COLL_KILL9_CHILD", "1")
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", n.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env("ROCECTL_COLL_ADDR", format!("127.78.{block}.{}", rank + 1))
                .env("ROCECTL_EXCLUSIVE", "1")
                .env("ROCECTL_COLL_TIMEOUT", "20")
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("a rank process");
            let out = c.stdout.take().expect("piped");
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    // libtest's "test rank_process ... " may precede it on the line.
                    if let Some(at) = line.find("COLL: ") {
                        let _ = tx.send((rank, line[at + 6..].to_string()));
                    }
                }
            });
            c
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut ready = 0;
    while ready < n {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((_, l)) if l == "ready" => ready += 1,
            Ok((r, l)) => panic!("rank {r} before the kill: {l}"),
            Err(_) => {
                for c in &mut children {
                    let _ = c.kill();
                }
                panic!("the ranks did not get ready");
            }
        }
    }
    std::thread::sleep(Duration::from_millis(200));
    let killed_at = now_ns();
    children[1].kill().expect("SIGKILL rank 1");
    let mut seen = Vec::new();
    while seen.len() < n - 1 {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok((r, l)) = rx.recv_timeout(left) else {
            for c in &mut children {
                let _ = c.kill();
            }
            panic!("only {seen:?} reported a failure");
        };
        let rest = l.strip_prefix("failed ").expect("a failure line");
        let (at, err) = rest.split_once(' ').expect("time and error");
        let at: u128 = at.parse().expect("a time");
        let after =
            Duration::from_nanos(u64::try_from(at.saturating_sub(killed_at)).unwrap_or(u64::MAX));
        assert!(err.contains("peer rank 1 failed"), "rank {r}: {err}");
        assert!(
            after < Duration::from_secs(1),
            "rank {r} failed {after:?} after the kill: {err}"
        );
        eprintln!("rank {r}: {err} ({after:?} after kill -9)");
        seen.push(r);
    }
    for (r, c) in children.iter_mut().enumerate() {
        let status = c.wait().expect("exit");
        if r != 1 {
            assert!(status.success(), "rank {r} did not exit cleanly: {status}");
        }
    }
}
