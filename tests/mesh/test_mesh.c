/* test_mesh: the device mesh at the launched rank count (1, 2, 4, 8).
 *
 * For every valid layout of this world size (pp x dp_replicate x dp_shard
 * x cp x tp, and ep where it divides), build the mesh on MPI_COMM_WORLD and
 * check each communicator's members, in order, against an independent
 * computation of torch's DeviceMesh layout: enumerate
 * torch.arange(world).reshape(pp, dp_replicate, dp_shard, cp, tp) with
 * nested loops and take the slice that varies the group's axes.  EP groups
 * are checked against arange(world).reshape(pp, ep_shard, ep) when tp is 1. */
#include <stdlib.h>
#include <string.h>

#include "mt_config.h"
#include "mt_mesh.h"
#include "mt_test.h"

#define MAXW 64

/* Axes varied by each group, as booleans over (pp, rep, shard, cp, tp). */
static const int varies[8][5] = {
    {1, 0, 0, 0, 0}, {0, 1, 0, 0, 0}, {0, 0, 1, 0, 0}, {0, 0, 0, 1, 0},
    {0, 0, 0, 0, 1}, {0, 1, 1, 0, 0}, {0, 0, 1, 1, 0}, {0, 1, 1, 1, 0},
};

/* Expected members of `me`'s group g, in torch slice order. */
static int expected_dense(const int shape[5], int g, int me, int *out)
{
    int coords[MAXW][5], n = 0, r = 0;
    for (int a = 0; a < shape[0]; a++)
        for (int b = 0; b < shape[1]; b++)
            for (int c = 0; c < shape[2]; c++)
                for (int d = 0; d < shape[3]; d++)
                    for (int e = 0; e < shape[4]; e++, r++) {
                        coords[r][0] = a, coords[r][1] = b, coords[r][2] = c;
                        coords[r][3] = d, coords[r][4] = e;
                    }
    for (int q = 0; q < r; q++) {
        int same = 1;
        for (int x = 0; x < 5; x++)
            if (!varies[g][x] && coords[q][x] != coords[me][x])
                same = 0;
        if (same)
            out[n++] = q;
    }
    return n;
}

/* torch arange(world).reshape(pp, ep_shard, ep): ep varies the last index,
 * ep_shard the middle one. */
static int expected_moe(int pp, int ep_shard, int ep, int g_is_ep, int me, int *out)
{
    int co[MAXW][3], r = 0, n = 0;
    for (int a = 0; a < pp; a++)
        for (int b = 0; b < ep_shard; b++)
            for (int c = 0; c < ep; c++, r++)
                co[r][0] = a, co[r][1] = b, co[r][2] = c;
    for (int q = 0; q < r; q++) {
        int same = co[q][0] == co[me][0] &&
                   (g_is_ep ? co[q][1] == co[me][1] : co[q][2] == co[me][2]);
        if (same)
            out[n++] = q;
    }
    return n;
}

static void members(MPI_Comm world, MPI_Comm comm, int *out, int *n)
{
    MPI_Group gw, gc;
    MPI_Comm_group(world, &gw);
    MPI_Comm_group(comm, &gc);
    MPI_Group_size(gc, n);
    int idx[MAXW];
    for (int i = 0; i < *n; i++)
        idx[i] = i;
    MPI_Group_translate_ranks(gc, *n, idx, gw, out);
    MPI_Group_free(&gw);
    MPI_Group_free(&gc);
}

static int layouts_checked;

/* The layout arithmetic alone (no communicators) for larger worlds: every
 * rank's group of every axis against the torch enumeration. */
static void check_layout_pure(int world, int pp, int rep, int shard, int cp, int tp)
{
    mt_layout_t lay = {world, {pp, rep, shard, cp, tp}, 1, 1};
    int shape[5] = {pp, rep, shard, cp, tp};
    int64_t table[MAXW];
    for (int g = 0; g < 8; g++) {
        int64_t gs = mt_layout_group_size(&lay, (mt_group_t)g);
        mt_layout_group_table(&lay, (mt_group_t)g, table);
        for (int r = 0; r < world; r++) {
            int want[MAXW];
            int nw = expected_dense(shape, g, r, want);
            int64_t id, idx;
            mt_layout_group_of(&lay, (mt_group_t)g, r, &id, &idx);
            int ok = nw == gs;
            for (int i = 0; ok && i < nw; i++)
                ok = table[id * gs + i] == want[i];
            CHECK(ok, "world %d layout %dx%dx%dx%dx%d: rank %d group %s", world, pp, rep, shard,
                  cp, tp, r, mt_group_name((mt_group_t)g));
        }
    }
}

static void check_layout(MPI_Comm world, int pp, int rep, int shard, int cp, int tp, int ep)
{
    int rank, size;
    MPI_Comm_rank(world, &rank);
    MPI_Comm_size(world, &size);
    char ov[16][96];
    int n = 0;
    mt_config_t cfg;
    mt_config_init(&cfg);
    /* A model every layout below can split: 8 heads, 8 layers, 8 experts. */
    snprintf(ov[n++], 96, "model.num_attention_heads=8");
    snprintf(ov[n++], 96, "model.num_key_value_heads=8");
    snprintf(ov[n++], 96, "model.hidden_size=64");
    snprintf(ov[n++], 96, "model.intermediate_size=128");
    snprintf(ov[n++], 96, "model.num_hidden_layers=8");
    snprintf(ov[n++], 96, "model.vocab_size=256");
    snprintf(ov[n++], 96, "dataset.seq_length=64");
    snprintf(ov[n++], 96, "step_scheduler.local_batch_size=2");
    snprintf(ov[n++], 96, "step_scheduler.global_batch_size=%d", 2 * rep * shard);
    snprintf(ov[n++], 96, "distributed.pp_size=%d", pp);
    snprintf(ov[n++], 96, "distributed.cp_size=%d", cp);
    snprintf(ov[n++], 96, "distributed.tp_size=%d", tp);
    if (rep > 1)
        snprintf(ov[n++], 96, "distributed.dp_replicate_size=%d", rep);
    if (pp > 1)
        snprintf(ov[n++], 96, "distributed.pipeline.pp_schedule=gpipe");
    if (ep > 1) {
        snprintf(ov[n++], 96, "distributed.ep_size=%d", ep);
        snprintf(ov[n++], 96, "model.num_experts=8");
    }
    for (int i = 0; i < n; i++)
        CHECK(mt_config_override(&cfg, ov[i]) == MT_OK, "%s: %s", ov[i], mt_error_message());
    mt_status_t s = mt_config_validate(&cfg, MT_APP_ANY, size, NULL, NULL);
    CHECK(s == MT_OK, "layout %dx%dx%dx%dx%d ep %d: %s", pp, rep, shard, cp, tp, ep,
          mt_error_message());
    if (s != MT_OK)
        return;

    mt_mesh_t mesh;
    s = mt_mesh_init(&mesh, world, &cfg);
    CHECK(s == MT_OK, "mesh init: %s", mt_error_message());
    if (s != MT_OK)
        return;
    int shape[5] = {pp, rep, shard, cp, tp};
    char what[64];
    snprintf(what, sizeof what, "pp%d rep%d shard%d cp%d tp%d ep%d", pp, rep, shard, cp, tp, ep);

    for (int g = 0; g < 8; g++) {
        int got[MAXW], want[MAXW], ng = 0;
        members(world, mesh.group[g], got, &ng);
        int nw = expected_dense(shape, g, rank, want);
        CHECK(ng == nw && memcmp(got, want, sizeof(int) * (size_t)nw) == 0,
              "%s: rank %d group %s differs from torch layout", what, rank, mt_group_name((mt_group_t)g));
        CHECK(mesh.group_size[g] == nw, "%s: group size", what);
    }
    if (ep > 1) {
        int es = rep * shard * cp / ep;
        CHECK(mesh.layout.ep_shard == es, "%s: ep_shard %lld", what, (long long)mesh.layout.ep_shard);
        for (int gi = 0; gi < 2; gi++) {
            mt_group_t g = gi ? MT_GROUP_EP : MT_GROUP_EP_SHARD;
            int got[MAXW], ng = 0;
            members(world, mesh.group[g], got, &ng);
            CHECK(ng == (gi ? ep : es), "%s: %s size %d", what, mt_group_name(g), ng);
            if (tp == 1) {
                int want[MAXW];
                int nw = expected_moe(pp, es, ep, gi, rank, want);
                CHECK(ng == nw && memcmp(got, want, sizeof(int) * (size_t)nw) == 0,
                      "%s: rank %d %s differs from torch (pp, ep_shard, ep) layout", what, rank,
                      mt_group_name(g));
            } else { /* members share this rank's pp and tp coordinates */
                for (int i = 0; i < ng; i++) {
                    int64_t c[MT_NAXES];
                    mt_layout_coords(&mesh.layout, got[i], c);
                    CHECK(c[MT_AXIS_PP] == mesh.coord[MT_AXIS_PP] && c[MT_AXIS_TP] == mesh.coord[MT_AXIS_TP],
                          "%s: %s member %d crosses pp/tp", what, mt_group_name(g), got[i]);
                }
            }
        }
    } else {
        CHECK(mesh.group[MT_GROUP_EP] == MPI_COMM_NULL, "%s: no EP groups without ep", what);
    }
    CHECK(mesh.num_nodes == 1 && mesh.node_id == 0 && mesh.node_size == size,
          "%s: one node here (got %d nodes, id %d, size %d)", what, mesh.num_nodes, mesh.node_id,
          mesh.node_size);
    mt_mesh_free(&mesh);
    layouts_checked++;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm world;
    MPI_Comm_dup(MPI_COMM_WORLD, &world);
    int size, rank;
    MPI_Comm_size(world, &size);
    MPI_Comm_rank(world, &rank);
    if (size > MAXW) {
        if (rank == 0)
            fprintf(stderr, "test_mesh: at most %d ranks\n", MAXW);
        MPI_Finalize();
        return 99;
    }

    /* Rank 0 checks the pure layout for larger worlds than it runs on. */
    static const int worlds[] = {8, 12, 16, 24, 32, 64};
    if (rank == 0)
        for (size_t w = 0; w < sizeof worlds / sizeof worlds[0]; w++)
            for (int pp = 1; pp <= worlds[w]; pp++)
                for (int cp = 1; cp <= worlds[w]; cp++)
                    for (int tp = 1; tp <= worlds[w]; tp++) {
                        if (worlds[w] % (pp * cp * tp))
                            continue;
                        int dp = worlds[w] / (pp * cp * tp);
                        for (int rep = 1; rep <= dp; rep++)
                            if (dp % rep == 0)
                                check_layout_pure(worlds[w], pp, rep, dp / rep, cp, tp);
                    }

    /* Every factorisation world = pp x dp x cp x tp, every dp_replicate
     * that divides dp (HSDP needs it smaller than dp), every ep that divides
     * dp x cp; with "stride=K", every K-th of them (communicator creation is
     * slow on oversubscribed cores; the pure check above covers the rest). */
    int stride = 1, index = 0;
    if (argc > 1 && strncmp(argv[1], "stride=", 7) == 0)
        stride = atoi(argv[1] + 7) > 0 ? atoi(argv[1] + 7) : 1;
    for (int pp = 1; pp <= size; pp++)
        for (int cp = 1; cp <= size; cp++)
            for (int tp = 1; tp <= size; tp++) {
                if (size % (pp * cp * tp))
                    continue;
                int dp = size / (pp * cp * tp);
                for (int rep = 1; rep <= dp; rep++) {
                    if (dp % rep || (rep > 1 && rep == dp))
                        continue;
                    for (int ep = 1; ep <= dp * cp; ep++) {
                        if ((dp * cp) % ep || 8 % ep)
                            continue;
                        if (index++ % stride == 0)
                            check_layout(world, pp, rep, dp / rep, cp, tp, ep);
                    }
                }
            }

    /* The node map on one machine: every rank on node 0. */
    int nodes[MAXW], nn = -1;
    CHECK(mt_node_map(world, nodes, &nn) == MT_OK, "%s", mt_error_message());
    CHECK(nn == 1, "one node, got %d", nn);
    for (int r = 0; r < size; r++)
        CHECK(nodes[r] == 0, "rank %d on node %d", r, nodes[r]);

    /* The library works on any communicator: a mesh over half the world. */
    if (size >= 2) {
        MPI_Comm half;
        MPI_Comm_split(world, rank % 2, rank, &half);
        int hs;
        MPI_Comm_size(half, &hs);
        mt_config_t cfg;
        mt_config_init(&cfg);
        CHECK(mt_config_override(&cfg, "step_scheduler.global_batch_size=64") == MT_OK, "gbs");
        /* a config names its model: the schema's defaults describe none */
        static const char *const shape[] = {"model.vocab_size=256", "model.hidden_size=64",
                                            "model.intermediate_size=128",
                                            "model.num_hidden_layers=2",
                                            "model.num_attention_heads=4"};
        for (int i = 0; i < 5; i++)
            CHECK(mt_config_override(&cfg, shape[i]) == MT_OK, "%s", shape[i]);
        CHECK(mt_config_validate(&cfg, MT_APP_ANY, hs, NULL, NULL) == MT_OK, "%s", mt_error_message());
        mt_mesh_t mesh;
        CHECK(mt_mesh_init(&mesh, half, &cfg) == MT_OK, "%s", mt_error_message());
        CHECK(mesh.group_size[MT_GROUP_DP_SHARD] == hs, "sub-communicator mesh");
        mt_mesh_free(&mesh);
        MPI_Comm_free(&half);
    }

    if (rank == 0)
        printf("test_mesh: %d layouts on %d ranks\n", layouts_checked, size);
    int rc = mt_test_exit_mpi("test_mesh", world);
    MPI_Comm_free(&world);
    MPI_Finalize();
    return rc;
}
