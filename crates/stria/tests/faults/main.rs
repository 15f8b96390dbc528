//! Fault campaigns through the real binary: `stria chaos drives`, `kill` (of the node, and of
//! its storage or metadata role) and `enospc`, each
//! with a short, fixed seed, asserting on the exit status and the summary line (data lost: 0).
//! STRIA_CHAOS_CYCLES raises the cycles of every campaign for a long run; STRIA_CHAOS_SEED
//! replaces the fixed seeds.

mod campaign;

use campaign::{cycles, run_campaign};

#[test]
fn drive_faults_on_every_raid_level_lose_nothing() {
    let cycles = cycles(3);
    let out = run_campaign(&["drives", "--level", "all"], cycles, 0xd21e5);
    // Every level ran its cycles and said so.
    for level in ["raid0", "raid1", "raid10", "raid5", "raid6"] {
        let line = format!("level {level}: {cycles} cycles, data lost: 0, failures: 0");
        assert!(out.contains(&line), "no `{line}` in:\n{out}");
    }
    assert!(out.contains(&format!("campaign drives: {} cycles", 5 * cycles)), "{out}");
}

#[test]
fn raid6_survives_two_drive_failures_and_refuses_a_third() {
    // A seed whose ten RAID 6 cycles draw both the two-failure and the too-many fault.
    let out = run_campaign(&["drives", "--level", "6"], cycles(10), 0x5);
    if campaign::seed_replaced() {
        return;
    }
    assert!(out.contains(" raid6 two-fail: "), "no two-drive failure was drawn:\n{out}");
    assert!(out.contains(" raid6 too-many: "), "no failure past tolerance was drawn:\n{out}");
}

#[test]
fn kill_9_of_the_node_loses_no_fsynced_change() {
    campaign::require_fuse();
    let out = run_campaign(&["kill", "--rebuild-percent", "50"], cycles(3), 0x4b1);
    assert!(out.contains("fsck clean"), "{out}");
}

#[test]
fn kill_9_of_the_storage_or_metadata_role_loses_no_fsynced_change() {
    campaign::require_fuse();
    // A seed whose first four cycles kill each role at least once.
    let out =
        run_campaign(&["kill", "--role", "any", "--rebuild-percent", "30"], cycles(4), 0x5101);
    assert!(out.contains("fsck clean"), "{out}");
    if !campaign::seed_replaced() {
        for role in ["storage role killed", "meta role killed"] {
            assert!(out.contains(role), "no `{role}` in:\n{out}");
        }
    }
}

#[test]
fn a_full_file_system_says_enospc_and_recovers() {
    campaign::require_fuse();
    let out = run_campaign(&["enospc"], cycles(1), 0xe05);
    assert!(out.contains("until ENOSPC"), "{out}");
}
