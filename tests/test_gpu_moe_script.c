/* test_gpu_moe_script.c — scripts/gpu-moe.sh's sanitizer lines, run here with stand-ins, and
 * scripts/device-bundle.sh.
 *
 * The script runs on the GPU machine; what can be checked without one is its scheduling of the
 * compute-sanitizer lines: one at a time by default, queued and run in LANES lanes otherwise,
 * every line exactly once, a line starting beside others only while the host's available memory,
 * less what the running lines may still take (SAN_MEM_GB each, less its resident memory), leaves
 * SAN_MEM_GB for it, SAN_LIMIT cutting a line with rc 124, PACK=1 moving the logs into one
 * archive (at the end, or when stopped), SAN_ONLY choosing lines by name, a compact bundle's
 * NAME.xz decompressed first, and bad settings refused; and scripts/device-bundle.sh with and
 * without COMPACT=1; scripts/device-base.sh on a scratch repository whose make target builds a
 * program that prints its commit's source. The stand-ins: build/device/moe_decode (records its
 * call and how many instances run at once) and compute-sanitizer / nvidia-smi on PATH, in a
 * scratch directory the script runs from.
 */
#include "test_common.h"

static char g_repo[1024];

static void write_exec(const char *path, const char *text)
{
    td_test_write_str(path, text);
    assert_int_equal(chmod(path, 0755), 0);
}

/* A scratch tree with the stand-ins; returns its directory (static buffer). */
static const char *setup_tree(const char *name)
{
    static char dir[2048];
    const char *rel = td_test_path(name); /* TD_TEST_TMP may be relative: the script cds */
    if (rel[0] == '/') snprintf(dir, sizeof dir, "%s", rel);
    else snprintf(dir, sizeof dir, "%s/%s", g_repo, rel);
    assert_int_equal(td_test_sh("rm -rf '%s' && mkdir -p '%s/build/device' '%s/bin' '%s/active'",
                                dir, dir, dir, dir), 0);
    char p[2304];
    snprintf(p, sizeof p, "%s/build/device/moe_decode", dir);
    /* records its arguments, counts the instances running now (mkdir is atomic), sleeps
     * STUB_SLEEP seconds (3 for a call with --M 1,16 when STUB_SLOW is set) */
    write_exec(p,
               "#!/usr/bin/env bash\n"
               "d=$(cd \"$(dirname \"$0\")/../..\" && pwd)\n"
               "echo \"$*\" >> \"$d/calls\"\n"
               "mkdir \"$d/active/$$\"\n"
               "ls \"$d/active\" | wc -l >> \"$d/conc\"\n"
               "s=${STUB_SLEEP:-0.3}\n"
               "case \"$*\" in *'--M 1,16 '*) [ -n \"${STUB_SLOW:-}\" ] && s=3;; esac\n"
               "sleep $s\n"
               "rmdir \"$d/active/$$\"\n");
    snprintf(p, sizeof p, "%s/bin/compute-sanitizer", dir);
    write_exec(p,
               "#!/usr/bin/env bash\n"
               "tool=\n"
               "while [ \"${1#--}\" != \"$1\" ]; do case $1 in --tool) tool=$2; shift 2;; "
               "--error-exitcode) shift 2;; *) shift;; esac; done\n"
               "\"$@\"; rc=$?\n"
               "if [ \"$tool\" = memcheck ]; then echo '========= ERROR SUMMARY: 0 errors'; "
               "else echo '========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)'; fi\n"
               "exit $rc\n");
    snprintf(p, sizeof p, "%s/bin/nvidia-smi", dir);
    write_exec(p, "#!/usr/bin/env bash\necho stand-in\n");
    return dir;
}

/* Run the script in `dir` with `env` and `sections`; stdout to dir/stdout; its exit status. */
static int run_script(const char *dir, const char *env, const char *sections)
{
    return td_test_sh("cd '%s' && env PATH='%s/bin':\"$PATH\" %s bash '%s/scripts/gpu-moe.sh' '%s/o' %s "
                      "> '%s/stdout' 2> '%s/stderr'",
                      dir, dir, env, g_repo, dir, sections, dir, dir);
}

static int count_lines(const char *text, const char *needle)
{
    int n = 0;
    for (const char *l = text; l && *l;) {
        const char *e = strchr(l, '\n');
        size_t len = e ? (size_t)(e - l) : strlen(l);
        char buf[1024];
        if (len >= sizeof buf) len = sizeof buf - 1;
        memcpy(buf, l, len);
        buf[len] = 0;
        if (strstr(buf, needle)) n++;
        l = e ? e + 1 : NULL;
    }
    return n;
}

static char *slurp_in(const char *dir, const char *name)
{
    char p[2304];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    char *s = td_test_slurp(p, NULL);
    assert_non_null(s);
    return s;
}

/* The script run in `dir` with `env` on sanitize_stage exits 2 with `why` on stderr before any
 * line ran (no stand-in call recorded). */
static void refused_before_any_line(const char *dir, const char *env, const char *why)
{
    assert_int_equal(run_script(dir, env, "sanitize_stage"), 2);
    char *err = slurp_in(dir, "stderr");
    assert_non_null(strstr(err, why));
    free(err);
    char p[2304];
    snprintf(p, sizeof p, "%s/calls", dir);
    struct stat st;
    assert_int_not_equal(stat(p, &st), 0);
}

static int max_conc(const char *dir)
{
    char *s = slurp_in(dir, "conc");
    int m = 0;
    for (char *t = strtok(s, "\n"); t; t = strtok(NULL, "\n")) m = atoi(t) > m ? atoi(t) : m;
    free(s);
    return m;
}

static const char *k_stage_names[] = {"memcheck_stage ", "memcheck_stage_bf16 ", "racecheck_stage ",
                                      "racecheck_stage_bf16 "};

/* Run sanitize_stage's four lines in a fresh tree with `env`; check that each was called and
 * reported once with rc 0 and its log written, the queue's header (NULL: none), and the most
 * lines that ran at once. Returns the tree; *out_p gets the script's stdout (caller frees). */
static const char *run_stage(const char *name, const char *env, const char *header, int conc,
                             char **out_p)
{
    const char *dir = setup_tree(name);
    assert_int_equal(run_script(dir, env, "sanitize_stage"), 0);
    char *out = slurp_in(dir, "stdout");
    if (header) assert_non_null(strstr(out, header));
    else assert_null(strstr(out, "sanitizer lines:")); /* nothing queued */
    for (int i = 0; i < 4; i++) assert_int_equal(count_lines(out, k_stage_names[i]), 1);
    assert_int_equal(count_lines(out, "rc=0"), 4);
    char p[2304];
    snprintf(p, sizeof p, "%s/o/logs/racecheck_stage_bf16.txt", dir);
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    char *calls = slurp_in(dir, "calls");
    assert_int_equal(count_lines(calls, "--M"), 4);
    free(calls);
    assert_int_equal(max_conc(dir), conc);
    *out_p = out;
    return dir;
}

static void one_at_a_time_by_default(void **state)
{
    (void)state;
    char *out;
    run_stage("serial", "", NULL, 1, &out);
    assert_int_equal(count_lines(out, "ERROR SUMMARY: 0 errors"), 2);
    assert_int_equal(count_lines(out, "RACECHECK SUMMARY: 0 hazards"), 2);
    free(out);
}

static void lanes_wait_for_memory(void **state)
{
    (void)state;
    /* no host has 100000 GB available: a line never starts beside another, although each
     * line runs for 1.5 s and three lanes wait */
    char *out;
    run_stage("lanes_mem", "LANES=3 SAN_MEM_GB=100000 STUB_SLEEP=1.5",
              "sanitizer lines: 4 in 3 lanes", 1, &out);
    free(out);
}

/* A MemAvailable of 120 GB (a file in place of /proc/meminfo) and three lanes of 1.5-s lines:
 * with 50 GB a line, two running may still take up to 100 of the 120, so a third never starts
 * beside them; with 39 GB a line, 120 - 2 x 39 = 42 GB leave room for a third. */
static void lanes_keep_room_for_running_lines(void **state)
{
    (void)state;
    char mi[2304], env[2600];
    const char *dir = setup_tree("lanes_reserve_mi");
    snprintf(mi, sizeof mi, "%s/meminfo", dir);
    td_test_write_str(mi, "MemTotal:       131072000 kB\nMemAvailable:   125829120 kB\n");
    char *out;
    snprintf(env, sizeof env, "LANES=3 SAN_MEM_GB=50 STUB_SLEEP=1.5 TD_MEMINFO='%s'", mi);
    run_stage("lanes_reserve50", env, "sanitizer lines: 4 in 3 lanes", 2, &out);
    free(out);
    snprintf(env, sizeof env, "LANES=3 SAN_MEM_GB=39 STUB_SLEEP=1.5 TD_MEMINFO='%s'", mi);
    run_stage("lanes_reserve39", env, "sanitizer lines: 4 in 3 lanes", 3, &out);
    free(out);
    /* a meminfo without MemAvailable: no room is assumed, one line at a time */
    td_test_write_str(mi, "MemTotal:       131072000 kB\n");
    snprintf(env, sizeof env, "LANES=3 SAN_MEM_GB=1 STUB_SLEEP=1.5 TD_MEMINFO='%s'", mi);
    run_stage("lanes_reserve_none", env, "sanitizer lines: 4 in 3 lanes", 1, &out);
    free(out);
}

static void lanes_run_every_line_once(void **state)
{
    (void)state;
    /* with memory to spare the lanes overlap */
    char *out;
    const char *dir = run_stage("lanes", "LANES=2 SAN_MEM_GB=0 STUB_SLEEP=1.5",
                                "sanitizer lines: 4 in 2 lanes", 2, &out);
    free(out);
    /* the queue's bookkeeping is gone */
    assert_int_equal(td_test_sh("ls -A '%s/o' | grep -q queue", dir), 1);
}

static void limit_cuts_a_line(void **state)
{
    (void)state;
    const char *dir = setup_tree("limit");
    /* memcheck_stage_bf16 and racecheck_stage_bf16 (--M 1,16) take 3 s, the limit is 1 s */
    assert_int_equal(run_script(dir, "LANES=2 SAN_MEM_GB=0 SAN_LIMIT=1 STUB_SLOW=1", "sanitize_stage"), 0);
    char *out = slurp_in(dir, "stdout");
    assert_int_equal(count_lines(out, "rc=124"), 2);
    assert_int_equal(count_lines(out, "cut at SAN_LIMIT=1s"), 2);
    assert_int_equal(count_lines(out, "rc=0"), 2);
    assert_int_equal(count_lines(out, "memcheck_stage_bf16 "), 1);
    free(out);
}

/* PACK=1: the logs end in one archive OUT/logs.tgz and OUT/logs is gone; a second call with the
 * same OUT adds its logs to the archive; a call stopped by TERM (a timeout) still packs. */
static void pack_moves_logs_into_one_archive(void **state)
{
    (void)state;
    const char *dir = setup_tree("pack");
    assert_int_equal(run_script(dir, "PACK=1", "sanitize_stage"), 0);
    assert_int_equal(td_test_sh("test -s '%s/o/logs.tgz' && ! test -e '%s/o/logs'", dir, dir), 0);
    assert_int_equal(td_test_sh("tar tzf '%s/o/logs.tgz' | grep -qx logs/racecheck_stage_bf16.txt", dir), 0);
    assert_int_equal(run_script(dir, "PACK=1", "sanitize_narrow"), 0);
    assert_int_equal(td_test_sh("tar tzf '%s/o/logs.tgz' > '%s/list' && grep -qx logs/racecheck_stage_bf16.txt '%s/list' "
                                "&& grep -qx logs/racecheck_narrow.txt '%s/list' && ! test -e '%s/o/logs'",
                                dir, dir, dir, dir, dir),
                     0);
    /* stopped after 1 s while a 3-s line runs: exit 143, the logs written so far packed */
    const char *d2 = setup_tree("pack_term");
    assert_int_equal(td_test_sh("cd '%s' && env PATH='%s/bin':\"$PATH\" PACK=1 STUB_SLEEP=3 timeout -s TERM 1 "
                                "bash '%s/scripts/gpu-moe.sh' '%s/o' sanitize_stage > '%s/stdout' 2>&1",
                                d2, d2, g_repo, d2, d2),
                     124);
    assert_int_equal(td_test_sh("tar tzf '%s/o/logs.tgz' | grep -qx logs/gpu.txt && ! test -e '%s/o/logs'", d2, d2), 0);
    /* without PACK the logs stay where they are */
    const char *d3 = setup_tree("nopack");
    assert_int_equal(run_script(d3, "", "sanitize_stage"), 0);
    assert_int_equal(td_test_sh("test -d '%s/o/logs' && ! test -e '%s/o/logs.tgz'", d3, d3), 0);
}

/* A bundle made with COMPACT=1 carries NAME.xz: the script decompresses it before its sections. */
static void compact_bundle_decompressed(void **state)
{
    (void)state;
    const char *dir = setup_tree("compact");
    assert_int_equal(td_test_sh("xz -9 '%s/build/device/moe_decode'", dir), 0);
    assert_int_equal(td_test_sh("test -f '%s/build/device/moe_decode.xz' && ! test -e '%s/build/device/moe_decode'",
                                dir, dir),
                     0);
    assert_int_equal(run_script(dir, "", "sanitize_stage"), 0);
    char *calls = slurp_in(dir, "calls");
    assert_int_equal(count_lines(calls, "--M"), 4);
    free(calls);
    assert_int_equal(td_test_sh("test -x '%s/build/device/moe_decode' && ! test -e '%s/build/device/moe_decode.xz'",
                                dir, dir),
                     0);
    /* an archive that is not one: refused before any section */
    const char *d2 = setup_tree("compact_bad");
    assert_int_equal(td_test_sh("echo not-xz > '%s/build/device/tandem.xz'", d2), 0);
    refused_before_any_line(d2, "", "cannot decompress");
}

/* scripts/device-bundle.sh: the binaries as they are, or with COMPACT=1 stripped and compressed
 * to NAME.xz (which decompresses to a binary that runs); COMPACT other than 0 or 1 refused. */
static void device_bundle_compact(void **state)
{
    (void)state;
    const char *dir = setup_tree("bundle");
    assert_int_equal(td_test_sh("cp /bin/true '%s/true' && cd '%s' && '%s/scripts/device-bundle.sh' plain '' '%s/true' "
                                "> log 2>&1 && cmp plain/true /bin/true",
                                dir, dir, g_repo, dir),
                     0);
    assert_int_equal(td_test_sh("cd '%s' && COMPACT=1 '%s/scripts/device-bundle.sh' small '' '%s/true' > log 2>&1 "
                                "&& ! test -e small/true && xz -dc small/true.xz > t && chmod +x t && ./t "
                                "&& test $(stat -c %%s small/true.xz) -lt $(stat -c %%s /bin/true)",
                                dir, g_repo, dir),
                     0);
    assert_int_equal(td_test_sh("cd '%s' && COMPACT=yes '%s/scripts/device-bundle.sh' bad '' '%s/true' > log 2>&1",
                                dir, g_repo, dir),
                     2);
}

/* scripts/device-base.sh in a scratch repository whose make target compiles a program that
 * prints the word in `src`: the program of the commit named (not of the working tree's
 * uncommitted change), the patch applied when given, NAME in the file name, the temporary
 * worktree removed in every case; bad arguments, a patch that does not apply and a failing
 * build refused (rc 2) with nothing written. */
static void device_base_builds_rev(void **state)
{
    (void)state;
    const char *dir = setup_tree("base");
    const char *g = "git -c user.name=t -c user.email=t@t";
    char p[2304];
    assert_int_equal(td_test_sh("mkdir -p '%s/r'", dir), 0);
    snprintf(p, sizeof p, "%s/r/Makefile", dir);
    td_test_write_str(p, "build/gpu/bench/moe_decode: src\n"
                         "\tgrep -qv fail src\n"
                         "\tmkdir -p build/gpu/bench\n"
                         "\tprintf '#include <stdio.h>\\nint main(void){puts(\"%s\");return 0;}\\n' "
                         "\"$$(cat src)\" > m.c\n"
                         "\tcc -o $@ m.c\n");
    snprintf(p, sizeof p, "%s/p.patch", dir);
    td_test_write_str(p, "--- a/src\n+++ b/src\n@@ -1 +1 @@\n-one\n+patched\n");
    /* three commits: src one, fail, one again; then an uncommitted change to dirty */
    assert_int_equal(td_test_sh("cd '%s/r' && git init -q . && echo one > src && printf '/build/\\nm.c\\n' > .gitignore && "
                                "%s add -A && %s commit -qm one && echo fail > src && %s commit -qam fail && "
                                "echo one > src && %s commit -qam one && echo dirty > src",
                                dir, g, g, g, g), 0);
    /* before make device-bundle: no build/device */
    assert_int_equal(td_test_sh("cd '%s/r' && '%s/scripts/device-base.sh' HEAD > ../log 2>&1", dir, g_repo), 2);
    assert_int_equal(td_test_sh("grep -q 'run make device-bundle first' '%s/log'", dir), 0);
    assert_int_equal(td_test_sh("mkdir -p '%s/r/build/device'", dir), 0);
    assert_int_equal(td_test_sh("cd '%s/r' && '%s/scripts/device-base.sh' HEAD > ../log 2>&1 && "
                                "xz -dc build/device/moe_decode_base.xz > ../b && chmod +x ../b && "
                                "test \"$(../b)\" = one && test -x build/device/moe_decode_base.xz && "
                                "test \"$(cat src)\" = dirty",
                                dir, g_repo), 0);
    assert_int_equal(td_test_sh("cd '%s/r' && '%s/scripts/device-base.sh' HEAD alt ../p.patch > ../log 2>&1 && "
                                "xz -dc build/device/moe_decode_alt.xz > ../a && chmod +x ../a && "
                                "test \"$(../a)\" = patched && grep -q 'p.patch' ../log",
                                dir, g_repo), 0);
    /* refused: a commit that does not exist, a bad name, a missing or foreign patch, a build
     * that fails (HEAD~1's src says fail) */
    assert_int_equal(td_test_sh("cd '%s/r' && '%s/scripts/device-base.sh' nosuch > ../log 2>&1", dir, g_repo), 2);
    assert_int_equal(td_test_sh("grep -q \"no commit named 'nosuch'\" '%s/log'", dir), 0);
    assert_int_equal(td_test_sh("cd '%s/r' && '%s/scripts/device-base.sh' HEAD Bad > ../log 2>&1", dir, g_repo), 2);
    assert_int_equal(td_test_sh("cd '%s/r' && '%s/scripts/device-base.sh' HEAD x ../none > ../log 2>&1", dir, g_repo), 2);
    assert_int_equal(td_test_sh("cd '%s/r' && '%s/scripts/device-base.sh' HEAD~1 x ../p.patch > ../log 2>&1", dir, g_repo), 2);
    assert_int_equal(td_test_sh("grep -q 'does not apply' '%s/log'", dir), 0);
    assert_int_equal(td_test_sh("mkdir '%s/tmp' && cd '%s/r' && TMPDIR='%s/tmp' '%s/scripts/device-base.sh' HEAD~1 broken "
                                "> ../log 2>&1", dir, dir, dir, g_repo), 2);
    assert_int_equal(td_test_sh("grep -q 'the build of .* failed' '%s/log'", dir), 0);
    assert_int_equal(td_test_sh("test -z \"$(ls -A '%s/tmp')\"", dir), 0); /* worktree and log gone */
    assert_int_equal(td_test_sh("cd '%s/r' && ! ls build/device | grep -q -e '^moe_decode_x' -e broken && "
                                "test $(git worktree list | wc -l) -eq 1",
                                dir), 0);
}

/* SAN_ONLY: only the named lines run (in lanes too); a name no chosen section has is an error
 * after the rest ran; a malformed list is refused before anything runs. */
static void only_named_lines_run(void **state)
{
    (void)state;
    const char *dir = setup_tree("only");
    assert_int_equal(run_script(dir, "SAN_ONLY=racecheck_stage_bf16,memcheck_stage", "sanitize_stage"), 0);
    char *out = slurp_in(dir, "stdout");
    assert_int_equal(count_lines(out, "racecheck_stage_bf16 "), 1);
    assert_int_equal(count_lines(out, "memcheck_stage "), 1);
    assert_int_equal(count_lines(out, "racecheck_stage "), 0);
    assert_int_equal(count_lines(out, "memcheck_stage_bf16 "), 0);
    assert_int_equal(count_lines(out, "rc=0"), 2);
    free(out);
    char *calls = slurp_in(dir, "calls");
    assert_int_equal(count_lines(calls, "--M"), 2);
    free(calls);
    const char *d2 = setup_tree("only_lanes");
    assert_int_equal(run_script(d2, "LANES=2 SAN_MEM_GB=0 SAN_ONLY=racecheck_stage", "sanitize_stage"), 0);
    out = slurp_in(d2, "stdout");
    assert_non_null(strstr(out, "sanitizer lines: 1 in 2 lanes"));
    assert_int_equal(count_lines(out, "racecheck_stage "), 1);
    free(out);
    /* a name of another section: the named line that is there still ran, then exit 2 */
    const char *d3 = setup_tree("only_missing");
    assert_int_equal(run_script(d3, "SAN_ONLY=racecheck_stage,racecheck_narrow", "sanitize_stage"), 2);
    char *err = slurp_in(d3, "stderr");
    assert_non_null(strstr(err, "SAN_ONLY names no line of the sections run: racecheck_narrow"));
    free(err);
    calls = slurp_in(d3, "calls");
    assert_int_equal(count_lines(calls, "--M"), 1);
    free(calls);
    refused_before_any_line(setup_tree("only_bad"), "SAN_ONLY='racecheck stage'", "SAN_ONLY takes line names");
}

static void bad_settings_refused(void **state)
{
    (void)state;
    const char *dir = setup_tree("bad");
    refused_before_any_line(dir, "LANES=three", "LANES, SAN_MEM_GB and SAN_LIMIT take whole numbers");
    refused_before_any_line(dir, "SAN_LIMIT=-5", "LANES, SAN_MEM_GB and SAN_LIMIT take whole numbers");
    refused_before_any_line(dir, "PACK=yes", "PACK takes 0 or 1");
}

int main(void)
{
    if (!getcwd(g_repo, sizeof g_repo)) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(one_at_a_time_by_default),
        cmocka_unit_test(lanes_wait_for_memory),
        cmocka_unit_test(lanes_keep_room_for_running_lines),
        cmocka_unit_test(lanes_run_every_line_once),
        cmocka_unit_test(limit_cuts_a_line),
        cmocka_unit_test(pack_moves_logs_into_one_archive),
        cmocka_unit_test(compact_bundle_decompressed),
        cmocka_unit_test(device_bundle_compact),
        cmocka_unit_test(device_base_builds_rev),
        cmocka_unit_test(only_named_lines_run),
        cmocka_unit_test(bad_settings_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
