//! A process killed (SIGKILL) mid-WRITE of blocks to a file, at random
//! points: every block the file holds afterwards is, byte for byte, either
//! the last generation whose WRITE completed (the process printed
//! `done G`) or the one being written when it died, never older bytes,
//! never anything else: what `Connector::begin_file_write` promises
//! (decision 0015). Random kill points from a seeded generator; 6 rounds,
//! 24 with `RELIABILITY_LONG`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;
use std::time::Duration;

use test_support::{Peer, pattern, runtime_available};

const BLOCKS: usize = 64;
const BLOCK: usize = 64 << 10;
const WAIT: Duration = Duration::from_secs(60);

fn generation(g: u64, i: usize) -> Vec<u8> {
    pattern(g * 1_000_003 + i as u64, BLOCK)
}

#[test]
fn a_write_killed_midway_leaves_each_byte_old_or_new() {
    if !runtime_available() {
        return;
    }
    let rounds = if std::env::var_os("RELIABILITY_LONG").is_some() {
        24
    } else {
        6
    };
    let path = std::env::temp_dir().join(format!("storage-crash-{}", std::process::id()));
    let mut seed = 0x5eed_u64;
    for round in 0..rounds {
        // Generation 0: the file as it was before the writer started.
        let old: Vec<u8> = (0..BLOCKS).flat_map(|i| generation(0, i)).collect();
        std::fs::write(&path, &old).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_nixl-test-peer"));
        command.args([
            "offload",
            path.to_str().unwrap(),
            &BLOCKS.to_string(),
            &BLOCK.to_string(),
        ]);
        let mut writer = Peer::spawn(command);
        // At least one generation done, then a kill after 0-20 ms more.
        assert_eq!(writer.line(WAIT), "done 1");
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        std::thread::sleep(Duration::from_micros(seed % 20_000));
        writer.kill();
        let mut done = 1;
        while let Some(line) = writer.leftover_line() {
            done = line.strip_prefix("done ").unwrap().parse().unwrap();
        }
        let file = std::fs::read(&path).unwrap();
        assert_eq!(
            file.len(),
            BLOCKS * BLOCK,
            "round {round}: the file's length changed"
        );
        for i in 0..BLOCKS {
            let (last, next) = (generation(done, i), generation(done + 1, i));
            let got = &file[i * BLOCK..(i + 1) * BLOCK];
            let wrong = (0..BLOCK).find(|&b| got[b] != last[b] && got[b] != next[b]);
            assert_eq!(
                wrong,
                None,
                "round {round}: block {i} holds a byte of neither generation {done} (completed) nor {}",
                done + 1
            );
        }
    }
    let _ = std::fs::remove_file(&path);
}
