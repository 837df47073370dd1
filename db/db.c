/* db.c — opening the store (checks, pragmas, migration, aborted sweep) and the run lifecycle
 * (db.h). Result writers are in write.c. */
#include "db_int.h"
#include "sha256.h"
#include "version.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ==== helpers ================================================================================ */

td_status td_db_sqlerr(sqlite3 *h, int rc, td_err *err, const char *what)
{
    td_status code;
    switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
        return td_err_set(err, TD_ERR_IO,
                          "%s: the results store is busy (another process held its write lock for "
                          "more than the busy timeout)", what);
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
        return td_err_set(err, TD_ERR_FORMAT,
                          "%s: the results store is corrupt (%s); 'tandem db info --check' runs an "
                          "integrity check", what, h ? sqlite3_errmsg(h) : sqlite3_errstr(rc));
    case SQLITE_CONSTRAINT: code = TD_ERR_ARG; break;
    case SQLITE_NOMEM: code = TD_ERR_NOMEM; break;
    case SQLITE_IOERR:
    case SQLITE_FULL:
    case SQLITE_CANTOPEN:
    case SQLITE_READONLY:
    case SQLITE_PERM: code = TD_ERR_IO; break;
    default: code = TD_ERR_INTERNAL; break;
    }
    return td_err_set(err, code, "%s: %s", what, h ? sqlite3_errmsg(h) : sqlite3_errstr(rc));
}

td_status td_db_prepare(td_db *db, const char *sql, sqlite3_stmt **st, td_err *err)
{
    int rc = sqlite3_prepare_v2(db->h, sql, -1, st, NULL);
    if (rc != SQLITE_OK) {
        *st = NULL;
        return td_db_sqlerr(db->h, rc, err, db->path);
    }
    return TD_OK;
}

td_status td_db_exec(td_db *db, const char *sql, td_err *err)
{
    int rc = sqlite3_exec(db->h, sql, NULL, NULL, NULL);
    if (rc != SQLITE_OK) return td_db_sqlerr(db->h, rc, err, db->path);
    return TD_OK;
}

int td_db_bind_text(sqlite3_stmt *st, int i, const char *s)
{
    return s ? sqlite3_bind_text(st, i, s, -1, SQLITE_TRANSIENT) : sqlite3_bind_null(st, i);
}

int td_db_bind_real(sqlite3_stmt *st, int i, double v)
{
    return v != v ? sqlite3_bind_null(st, i) : sqlite3_bind_double(st, i, v);
}

int td_db_bind_count(sqlite3_stmt *st, int i, int64_t v)
{
    return v < 0 ? sqlite3_bind_null(st, i) : sqlite3_bind_int64(st, i, v);
}

td_status td_db_query_int(td_db *db, const char *sql, int64_t bind1, int64_t *out, td_err *err)
{
    sqlite3_stmt *st;
    td_status s = td_db_prepare(db, sql, &st, err);
    if (s != TD_OK) return s;
    if (sqlite3_bind_parameter_count(st) >= 1) sqlite3_bind_int64(st, 1, bind1);
    int rc = sqlite3_step(st);
    *out = 0;
    if (rc == SQLITE_ROW) *out = sqlite3_column_int64(st, 0);
    else if (rc != SQLITE_DONE) s = td_db_sqlerr(db->h, rc, err, db->path);
    sqlite3_finalize(st);
    return s;
}

const td_prov_host *td_db_host(td_db *db)
{
    if (!db->host_ready) {
        td_prov_host_get(&db->host);
        db->host_ready = true;
    }
    return &db->host;
}

td_status td_db_tx_begin(td_db *db, bool *owned, td_err *err)
{
    *owned = !db->in_batch;
    if (!*owned) return TD_OK;
    td_status s = td_db_exec(db, "BEGIN IMMEDIATE", err);
    if (s == TD_OK) db->checked_run = 0;
    return s;
}

td_status td_db_tx_commit(td_db *db, bool owned, td_err *err)
{
    if (!owned) return TD_OK;
    td_status s = td_db_exec(db, "COMMIT", err);
    if (s != TD_OK) td_db_tx_rollback(db, owned);
    db->checked_run = 0;
    return s;
}

void td_db_tx_rollback(td_db *db, bool owned)
{
    if (!owned) return;
    if (!sqlite3_get_autocommit(db->h)) sqlite3_exec(db->h, "ROLLBACK", NULL, NULL, NULL);
    db->checked_run = 0;
}

const char *td_db_path_resolve(const char *opt)
{
    if (opt && *opt) return opt;
    const char *e = getenv("TANDEM_DB");
    if (e && *e) return e;
    return TD_DB_DEFAULT_PATH;
}

const char *td_db_path(const td_db *db) { return db->path; }
int td_db_aborted_at_open(const td_db *db) { return db->aborted_at_open; }
void td_db_set_busy_timeout(td_db *db, int ms) { sqlite3_busy_timeout(db->h, ms < 0 ? 0 : ms); }

/* ==== file checks before SQLite touches anything ============================================= */

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* *exists: the file exists with content. Refuses what is visibly not a sound SQLite file. */
static td_status check_file(const char *path, bool *exists, td_err *err)
{
    struct stat sb;
    *exists = false;
    if (stat(path, &sb) != 0) {
        if (errno == ENOENT) return TD_OK;
        return td_err_set(err, TD_ERR_IO, "%s: %s", path, strerror(errno));
    }
    if (!S_ISREG(sb.st_mode))
        return td_err_set(err, TD_ERR_ARG, "%s: not a regular file; refusing to use it as a results store", path);
    if (sb.st_size == 0) return TD_OK;
    *exists = true;
    FILE *f = fopen(path, "rb");
    if (!f) return td_err_set(err, TD_ERR_IO, "%s: %s", path, strerror(errno));
    unsigned char h[100];
    size_t n = fread(h, 1, sizeof h, f);
    fclose(f);
    if (n < sizeof h || memcmp(h, "SQLite format 3", 16))
        return td_err_set(err, TD_ERR_FORMAT,
                          "%s: not an SQLite database (bad header); refusing to use it as a results "
                          "store (nothing was changed)", path);
    uint32_t page = (uint32_t)h[16] << 8 | h[17];
    if (page == 1) page = 65536;
    if (page < 512 || (page & (page - 1)) || h[21] != 64 || h[22] != 32 || h[23] != 32)
        return td_err_set(err, TD_ERR_FORMAT,
                          "%s: corrupt SQLite header; refusing to use it (nothing was changed)", path);
    /* The in-header page count is valid when the change counter matches version-valid-for.
     * Without a WAL holding newer pages the file must be at least that long. */
    uint32_t npages = be32(h + 28);
    if (npages && be32(h + 24) == be32(h + 92)) {
        char wal[PATH_MAX];
        struct stat ws;
        bool wal_has_data = snprintf(wal, sizeof wal, "%s-wal", path) < (int)sizeof wal &&
                            stat(wal, &ws) == 0 && ws.st_size > 0;
        if (!wal_has_data && (uint64_t)sb.st_size < (uint64_t)npages * page)
            return td_err_set(err, TD_ERR_FORMAT,
                              "%s: truncated SQLite database (%lld bytes, header says %llu); refusing "
                              "to use it (nothing was changed)", path, (long long)sb.st_size,
                              (unsigned long long)npages * page);
    }
    return TD_OK;
}

/* ==== open =================================================================================== */

typedef struct db_state {
    int64_t app_id, version, n_objects;
} db_state;

static td_status read_state_tx(td_db *db, db_state *s, td_err *err)
{
    static const char *const q[3] = {"PRAGMA application_id", "PRAGMA user_version",
                                     "SELECT count(*) FROM sqlite_master"};
    int64_t *dst[3] = {&s->app_id, &s->version, &s->n_objects};
    for (int i = 0; i < 3; i++) {
        sqlite3_stmt *st;
        int rc = sqlite3_prepare_v2(db->h, q[i], -1, &st, NULL);
        if (rc == SQLITE_OK) rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) *dst[i] = sqlite3_column_int64(st, 0);
        sqlite3_finalize(st);
        if (rc != SQLITE_ROW) {
            if ((rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED)
                return td_db_sqlerr(db->h, rc, err, db->path);
            return td_err_set(err, TD_ERR_FORMAT,
                              "%s: corrupt or not an SQLite database (%s); refusing to use it "
                              "as a results store (nothing was changed)", db->path, sqlite3_errstr(rc));
        }
    }
    return TD_OK;
}

/* Application id, version and object count, read in one snapshot (own read transaction
 * unless the caller holds one): a peer creating the store must not be seen half-way. */
static td_status read_state(td_db *db, db_state *s, td_err *err)
{
    bool own = sqlite3_get_autocommit(db->h) != 0;
    if (own && sqlite3_exec(db->h, "BEGIN", NULL, NULL, NULL) != SQLITE_OK) own = false;
    td_status st = read_state_tx(db, s, err);
    if (own) sqlite3_exec(db->h, "COMMIT", NULL, NULL, NULL);
    return st;
}

static td_status check_state(td_db *db, const db_state *s, td_err *err)
{
    bool fresh = s->app_id == 0 && s->version == 0 && s->n_objects == 0;
    if (fresh) return TD_OK;
    if (s->app_id != TD_DB_APPLICATION_ID)
        return td_err_set(err, TD_ERR_FORMAT,
                          "%s: an SQLite database but not a tandem results store (application_id "
                          "0x%llx, %lld schema objects); refusing to touch it", db->path,
                          (unsigned long long)s->app_id, (long long)s->n_objects);
    if (s->version > TD_DB_SCHEMA_VERSION)
        return td_err_set(err, TD_ERR_UNSUPPORTED,
                          "%s: schema version %lld is newer than this tandem understands (%d); use a "
                          "newer tandem", db->path, (long long)s->version, TD_DB_SCHEMA_VERSION);
    if (s->version < 1)
        return td_err_set(err, TD_ERR_FORMAT, "%s: tandem store with no schema (version %lld); refusing it",
                          db->path, (long long)s->version);
    return TD_OK;
}

static td_status set_wal(td_db *db, td_err *err)
{
    /* journal_mode cannot change while another connection holds the file; retry briefly. */
    for (int attempt = 0;; attempt++) {
        sqlite3_stmt *st;
        int rc = sqlite3_prepare_v2(db->h, "PRAGMA journal_mode=WAL", -1, &st, NULL);
        if (rc == SQLITE_OK) rc = sqlite3_step(st);
        bool wal = rc == SQLITE_ROW && !strcmp((const char *)sqlite3_column_text(st, 0), "wal");
        sqlite3_finalize(st);
        if (wal) return TD_OK;
        if (rc == SQLITE_ROW)
            return td_err_set(err, TD_ERR_IO, "%s: cannot switch the store to WAL mode", db->path);
        if ((rc & 0xff) != SQLITE_BUSY && (rc & 0xff) != SQLITE_LOCKED)
            return td_db_sqlerr(db->h, rc, err, db->path);
        if (attempt > 3000) return td_db_sqlerr(db->h, rc, err, db->path);
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

static td_status migrate(td_db *db, td_err *err)
{
    td_status s = td_db_exec(db, "BEGIN IMMEDIATE", err);
    if (s != TD_OK) return s;
    db_state st;
    s = read_state(db, &st, err); /* again, under the write lock: a peer may have migrated */
    if (s == TD_OK) s = check_state(db, &st, err);
    if (s == TD_OK && st.version < TD_DB_SCHEMA_VERSION)
        s = td_db_schema_migrate(db->h, (int)st.version, TD_DB_SCHEMA_VERSION, err);
    if (s == TD_OK) s = td_db_exec(db, "COMMIT", err);
    if (s != TD_OK && !sqlite3_get_autocommit(db->h)) sqlite3_exec(db->h, "ROLLBACK", NULL, NULL, NULL);
    return s;
}

/* Is the process that opened a run still the same live process? Same boot (when both boot
 * ids are known), and the pid's start time equals the recorded one (pid reuse proof); with no
 * recorded start time, whether the pid exists at all. */
static bool owner_alive(const td_prov_host *me, int64_t pid, bool start_known, int64_t start,
                        const char *boot)
{
    if (boot && me->boot_id[0] && strcmp(boot, me->boot_id)) return false;
    if (start_known) return td_prov_proc_start(pid) == start;
    if (pid <= 0) return false;
    return kill((pid_t)pid, 0) == 0 || errno == EPERM;
}

/* Mark `aborted` the runs of this host whose process is gone (in chunks of 64). */
static td_status sweep_aborted(td_db *db, td_err *err)
{
    const td_prov_host *me = td_db_host(db);
    for (;;) {
        sqlite3_stmt *q;
        td_status s = td_db_prepare(db,
                                    "SELECT id, pid, proc_start, boot_id FROM runs WHERE status = "
                                    "'running' AND host = ?1 AND coalesce(machine_id, '') = ?2", &q, err);
        if (s != TD_OK) return s;
        sqlite3_bind_text(q, 1, me->host, -1, SQLITE_STATIC);
        sqlite3_bind_text(q, 2, me->machine_id, -1, SQLITE_STATIC);
        int64_t gone[64];
        int n = 0, rc;
        while (n < (int)TD_ARRAY_LEN(gone) && (rc = sqlite3_step(q)) == SQLITE_ROW) {
            bool known = sqlite3_column_type(q, 2) != SQLITE_NULL;
            if (!owner_alive(me, sqlite3_column_int64(q, 1), known, sqlite3_column_int64(q, 2),
                             (const char *)sqlite3_column_text(q, 3)))
                gone[n++] = sqlite3_column_int64(q, 0);
        }
        sqlite3_finalize(q);
        if (n == 0) return TD_OK;

        char now[TD_PROV_TIME_LEN + 1];
        td_prov_now_iso(now);
        s = td_db_exec(db, "BEGIN IMMEDIATE", err);
        if (s != TD_OK) return s;
        sqlite3_stmt *u;
        s = td_db_prepare(db,
                          "UPDATE runs SET status = 'aborted', ended_at = ?2, message = "
                          "'process ' || pid || ' on ' || host || ' ended without closing the run' "
                          "WHERE id = ?1 AND status = 'running'", &u, err);
        for (int i = 0; i < n && s == TD_OK; i++) {
            sqlite3_bind_int64(u, 1, gone[i]);
            sqlite3_bind_text(u, 2, now, -1, SQLITE_STATIC);
            rc = sqlite3_step(u);
            if (rc != SQLITE_DONE) s = td_db_sqlerr(db->h, rc, err, db->path);
            else db->aborted_at_open += sqlite3_changes(db->h);
            sqlite3_reset(u);
        }
        sqlite3_finalize(u);
        if (s == TD_OK) s = td_db_exec(db, "COMMIT", err);
        if (s != TD_OK) {
            if (!sqlite3_get_autocommit(db->h)) sqlite3_exec(db->h, "ROLLBACK", NULL, NULL, NULL);
            return s;
        }
        if (n < (int)TD_ARRAY_LEN(gone)) return TD_OK;
    }
}

td_status td_db_open(const char *path, unsigned flags, td_db **out, td_err *err)
{
    *out = NULL;
    TD_ASSERT(path);
    bool exists;
    td_status s = check_file(path, &exists, err);
    if (s != TD_OK) return s;
    bool ro = flags & TD_DB_READONLY;
    if (!exists && access(path, F_OK) != 0 && (ro || !(flags & TD_DB_CREATE)))
        return td_err_set(err, TD_ERR_NOTFOUND,
                          "%s: no results store here (give --db PATH or set TANDEM_DB)", path);

    td_db *db = calloc(1, sizeof *db);
    if (!db) return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    db->path = strdup(path);
    db->flags = flags;
    if (!db->path) { free(db); return td_err_set(err, TD_ERR_NOMEM, "out of memory"); }
    /* URI names are enabled so that merge can ATTACH its source read-only; a plain path that
     * happens to start with "file:" is kept a plain path by a "./" prefix. */
    int oflags = (ro ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE) |
                 SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_URI;
    char *opath = NULL;
    if (!strncmp(path, "file:", 5)) {
        opath = malloc(strlen(path) + 3);
        if (opath) sprintf(opath, "./%s", path);
    }
    int rc = sqlite3_open_v2(opath ? opath : path, &db->h, oflags, NULL);
    free(opath);
    if (rc != SQLITE_OK) {
        s = td_err_set(err, TD_ERR_IO, "%s: cannot open: %s", path,
                       db->h ? sqlite3_errmsg(db->h) : sqlite3_errstr(rc));
        td_db_close(db);
        return s;
    }
    sqlite3_extended_result_codes(db->h, 1);
    sqlite3_busy_timeout(db->h, TD_DB_BUSY_TIMEOUT_MS);

    db_state st;
    s = read_state(db, &st, err);
    if (s == TD_OK) s = check_state(db, &st, err);
    if (s == TD_OK && ro) {
        if (st.version == 0)
            s = td_err_set(err, TD_ERR_NOTFOUND, "%s: an empty results store", path);
        else if (st.version < TD_DB_SCHEMA_VERSION)
            s = td_err_set(err, TD_ERR_UNSUPPORTED,
                           "%s: schema version %lld needs migrating to %d; open it once read-write "
                           "(for example 'tandem db --db %s info')", path, (long long)st.version,
                           TD_DB_SCHEMA_VERSION, path);
    }
    if (s == TD_OK && !ro) {
        s = set_wal(db, err);
        if (s == TD_OK) s = td_db_exec(db, "PRAGMA synchronous = NORMAL", err);
        if (s == TD_OK && st.version < TD_DB_SCHEMA_VERSION) s = migrate(db, err);
    }
    if (s == TD_OK)
        s = td_db_exec(db, "PRAGMA foreign_keys = ON; PRAGMA cache_size = -32768; PRAGMA wal_autocheckpoint = 8192; "
                           "PRAGMA journal_size_limit = 67108864; "
                           "PRAGMA temp_store = MEMORY", err);
    if (s == TD_OK && !ro) s = sweep_aborted(db, err);
    if (s != TD_OK) {
        td_db_close(db);
        return s;
    }
    *out = db;
    return TD_OK;
}

void td_db_close(td_db *db)
{
    if (!db) return;
    if (db->h) {
        if (!sqlite3_get_autocommit(db->h)) sqlite3_exec(db->h, "ROLLBACK", NULL, NULL, NULL);
        for (int i = 0; i < TD_DB_PUT_COUNT; i++) sqlite3_finalize(db->put[i]);
        sqlite3_close(db->h);
    }
    free(db->path);
    free(db);
}

/* ==== names ================================================================================== */

static const char *const status_names[TD_DB_RUN_STATUS_COUNT] = {"running", "ok", "failed", "aborted"};
static const char *const expect_names[TD_DB_EXPECT_COUNT] = {"exact", "bounded"};
static const char *const verdict_names[TD_DB_VERDICT_COUNT] = {"pass", "fail", "skip"};

const char *td_db_run_status_name(td_db_run_status s)
{
    return (unsigned)s < TD_DB_RUN_STATUS_COUNT ? status_names[s] : NULL;
}
const char *td_db_expect_name(td_db_expect e)
{
    return (unsigned)e < TD_DB_EXPECT_COUNT ? expect_names[e] : NULL;
}
const char *td_db_verdict_name(td_db_verdict v)
{
    return (unsigned)v < TD_DB_VERDICT_COUNT ? verdict_names[v] : NULL;
}

/* ==== runs =================================================================================== */

static bool kind_valid(const char *k)
{
    if (!k || !*k || strlen(k) > 64) return false;
    for (const char *p = k; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '.' || *p == '_' || *p == '-'))
            return false;
    return true;
}

/* JSON text of a cJSON value (malloc'd) and free the value; NULL on allocation failure. */
static char *json_take(cJSON *j)
{
    if (!j) return NULL;
    char *t = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return t;
}

static cJSON *string_array(char *const *v, size_t n)
{
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; a && i < n; i++) {
        char *c = td_prov_utf8_clean(v[i] ? v[i] : "");
        cJSON *s = c ? cJSON_CreateString(c) : NULL;
        free(c);
        if (!s) { cJSON_Delete(a); return NULL; }
        cJSON_AddItemToArray(a, s);
    }
    return a;
}

static cJSON *seed_array(const uint64_t *seeds, size_t n)
{
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; a && i < n; i++) {
        cJSON *s;
        if (seeds[i] < (UINT64_C(1) << 53)) {
            s = cJSON_CreateNumber((double)seeds[i]);
        } else { /* beyond exact doubles: keep the digits */
            char b[32];
            snprintf(b, sizeof b, "%llu", (unsigned long long)seeds[i]);
            s = cJSON_CreateString(b);
        }
        if (!s) { cJSON_Delete(a); return NULL; }
        cJSON_AddItemToArray(a, s);
    }
    return a;
}

td_status td_db_run_begin(td_db *db, const td_db_run_info *info, int64_t *run_id, td_err *err)
{
    TD_ASSERT(db && info && run_id);
    *run_id = 0;
    if (db->flags & TD_DB_READONLY) return td_err_set(err, TD_ERR_ARG, "%s: opened read-only", db->path);
    if (!kind_valid(info->kind))
        return td_err_set(err, TD_ERR_ARG, "run kind '%s' is not [a-z0-9._-]{1,64}",
                          info->kind ? info->kind : "(null)");
    const td_prov_host *me = td_db_host(db);
    if (!db->binary_sha256[0]) {
        td_err e2;
        if (td_prov_self_sha256(db->binary_sha256, &e2) != TD_OK) db->binary_sha256[0] = '\0';
    }
    char uid[37], now[TD_PROV_TIME_LEN + 1], fp[65] = "";
    td_status s = td_prov_uid(uid, err);
    if (s != TD_OK) return s;
    char *ckpt = NULL;
    if (info->checkpoint) {
        s = td_prov_checkpoint_fingerprint(info->checkpoint, info->checkpoint_full_hash, fp, err);
        if (s != TD_OK) return td_err_prefix(err, "checkpoint fingerprint: ");
        char *rp = realpath(info->checkpoint, NULL);
        ckpt = td_prov_utf8_clean(rp ? rp : info->checkpoint);
        free(rp);
    }
    char *cmd = json_take(string_array(info->argv, info->argc > 0 ? (size_t)info->argc : 0));
    char *env = json_take(td_prov_env_json());
    char *var = json_take(string_array((char *const *)info->variants, info->n_variants));
    char *seeds = json_take(seed_array(info->seeds, info->n_seeds));
    if (!cmd || !env || !var || !seeds || (info->checkpoint && !ckpt)) {
        s = td_err_set(err, TD_ERR_NOMEM, "out of memory");
        goto out;
    }
    td_prov_now_iso(now);

    sqlite3_stmt *st;
    s = td_db_prepare(db,
                      "INSERT INTO runs (uid, kind, status, started_at, tandem_version, git_commit, "
                      "binary_sha256, host, machine_id, boot_id, pid, proc_start, cpu, "
                      "checkpoint_path, checkpoint_fingerprint, checkpoint_full, command_line, env, "
                      "variants, seeds) VALUES (?1, ?2, 'running', ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, "
                      "?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19)", &st, err);
    if (s != TD_OK) goto out;
    sqlite3_bind_text(st, 1, uid, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, info->kind, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, now, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, td_version(), -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, td_commit(), -1, SQLITE_STATIC);
    td_db_bind_text(st, 6, db->binary_sha256[0] ? db->binary_sha256 : NULL);
    sqlite3_bind_text(st, 7, me->host, -1, SQLITE_STATIC);
    td_db_bind_text(st, 8, me->machine_id[0] ? me->machine_id : NULL);
    td_db_bind_text(st, 9, me->boot_id[0] ? me->boot_id : NULL);
    sqlite3_bind_int64(st, 10, me->pid);
    td_db_bind_count(st, 11, me->proc_start);
    sqlite3_bind_text(st, 12, me->cpu, -1, SQLITE_STATIC);
    td_db_bind_text(st, 13, ckpt);
    td_db_bind_text(st, 14, info->checkpoint ? fp : NULL);
    if (info->checkpoint) sqlite3_bind_int(st, 15, info->checkpoint_full_hash ? 1 : 0);
    else sqlite3_bind_null(st, 15);
    sqlite3_bind_text(st, 16, cmd, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 17, env, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 18, var, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 19, seeds, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc != SQLITE_DONE) s = td_db_sqlerr(db->h, rc, err, db->path);
    else *run_id = sqlite3_last_insert_rowid(db->h);
    sqlite3_finalize(st);
out:
    free(ckpt);
    cJSON_free(cmd);
    cJSON_free(env);
    cJSON_free(var);
    cJSON_free(seeds);
    return s;
}

td_status td_db_run_set_device(td_db *db, int64_t run_id, const td_db_device *dev, td_err *err)
{
    TD_ASSERT(db && dev);
    char mod[65] = "";
    if (dev->cuda_module_path) {
        td_status s = td_sha256_file(dev->cuda_module_path, mod, err);
        if (s != TD_OK) return s;
    }
    sqlite3_stmt *st;
    td_status s = td_db_prepare(db,
                                "UPDATE runs SET gpu_name = coalesce(?2, gpu_name), "
                                "gpu_driver = coalesce(?3, gpu_driver), "
                                "cuda_version = coalesce(?4, cuda_version), "
                                "nccl_version = coalesce(?5, nccl_version), "
                                "cuda_module_sha256 = coalesce(?6, cuda_module_sha256) WHERE id = ?1",
                                &st, err);
    if (s != TD_OK) return s;
    sqlite3_bind_int64(st, 1, run_id);
    td_db_bind_text(st, 2, dev->gpu_name);
    td_db_bind_text(st, 3, dev->gpu_driver);
    td_db_bind_text(st, 4, dev->cuda_version);
    td_db_bind_text(st, 5, dev->nccl_version);
    td_db_bind_text(st, 6, mod[0] ? mod : NULL);
    int rc = sqlite3_step(st);
    if (rc != SQLITE_DONE) s = td_db_sqlerr(db->h, rc, err, db->path);
    else if (sqlite3_changes(db->h) == 0)
        s = td_err_set(err, TD_ERR_NOTFOUND, "%s: no run %lld", db->path, (long long)run_id);
    sqlite3_finalize(st);
    return s;
}

td_status td_db_run_end(td_db *db, int64_t run_id, td_db_run_status status, int exit_code,
                        const char *message, td_err *err)
{
    TD_ASSERT(db);
    TD_ASSERT(!db->in_batch); /* commit or roll back the batch before closing the run */
    if (status != TD_DB_RUN_OK && status != TD_DB_RUN_FAILED)
        return td_err_set(err, TD_ERR_ARG, "a run ends 'ok' or 'failed'");
    char now[TD_PROV_TIME_LEN + 1];
    td_prov_now_iso(now);
    sqlite3_stmt *st;
    td_status s = td_db_prepare(db,
                                "UPDATE runs SET status = ?2, ended_at = ?3, exit_code = ?4, "
                                "message = ?5 WHERE id = ?1 AND status = 'running'", &st, err);
    if (s != TD_OK) return s;
    char *msg = message ? td_prov_utf8_clean(message) : NULL;
    sqlite3_bind_int64(st, 1, run_id);
    sqlite3_bind_text(st, 2, td_db_run_status_name(status), -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, now, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 4, exit_code);
    td_db_bind_text(st, 5, msg);
    int rc = sqlite3_step(st);
    if (rc != SQLITE_DONE) s = td_db_sqlerr(db->h, rc, err, db->path);
    else if (sqlite3_changes(db->h) == 0)
        s = td_err_set(err, TD_ERR_ARG, "%s: run %lld is not running (unknown, already ended or aborted)",
                       db->path, (long long)run_id);
    sqlite3_finalize(st);
    free(msg);
    return s;
}

td_status td_db_run_uid(td_db *db, int64_t run_id, char uid[TD_DB_UID_LEN + 1], td_err *err)
{
    sqlite3_stmt *st;
    uid[0] = '\0';
    td_status s = td_db_prepare(db, "SELECT uid FROM runs WHERE id = ?1", &st, err);
    if (s != TD_OK) return s;
    sqlite3_bind_int64(st, 1, run_id);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) snprintf(uid, TD_DB_UID_LEN + 1, "%s", (const char *)sqlite3_column_text(st, 0));
    else if (rc == SQLITE_DONE) s = td_err_set(err, TD_ERR_NOTFOUND, "%s: no run %lld", db->path, (long long)run_id);
    else s = td_db_sqlerr(db->h, rc, err, db->path);
    sqlite3_finalize(st);
    return s;
}
