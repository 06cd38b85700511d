/* mesh_layout.c: rank <-> mesh coordinates and process groups, as pure
 * arithmetic.  A group is identified by the coordinates it does not vary
 * (its id, row-major over those) and a member by the coordinates it does
 * (its index, row-major over those), so ranks inside a group keep the
 * order of the torch DeviceMesh slice. */
#include "mt_mesh.h"

#include <stdlib.h>

static const char *axis_names[MT_NAXES] = {"pp", "dp_replicate", "dp_shard", "cp", "tp"};
static const char *group_names[MT_NGROUPS] = {"pp", "dp_replicate", "dp_shard", "cp", "tp",
                                              "dp", "dp_shard_cp", "dp_cp", "ep_shard", "ep"};

/* Dense-mesh axes spanned by each group (bit a = axis a). */
static const unsigned group_axes[MT_NGROUPS] = {
    1u << MT_AXIS_PP,
    1u << MT_AXIS_DP_REPLICATE,
    1u << MT_AXIS_DP_SHARD,
    1u << MT_AXIS_CP,
    1u << MT_AXIS_TP,
    (1u << MT_AXIS_DP_REPLICATE) | (1u << MT_AXIS_DP_SHARD),
    (1u << MT_AXIS_DP_SHARD) | (1u << MT_AXIS_CP),
    (1u << MT_AXIS_DP_REPLICATE) | (1u << MT_AXIS_DP_SHARD) | (1u << MT_AXIS_CP),
    0, 0 /* MoE mesh: handled separately */
};

const char *mt_axis_name(mt_axis_t a) { return a < MT_NAXES ? axis_names[a] : "?"; }
const char *mt_group_name(mt_group_t g) { return g < MT_NGROUPS ? group_names[g] : "?"; }

void mt_layout_from_config(const mt_config_t *cfg, mt_layout_t *lay)
{
    const mt_distributed_config_t *d = &cfg->distributed;
    lay->world = cfg->derived.world_size;
    lay->size[MT_AXIS_PP] = d->pp_size;
    lay->size[MT_AXIS_DP_REPLICATE] = cfg->derived.dp_replicate;
    lay->size[MT_AXIS_DP_SHARD] = cfg->derived.dp_shard;
    lay->size[MT_AXIS_CP] = d->cp_size;
    lay->size[MT_AXIS_TP] = d->tp_size;
    lay->ep = d->ep_size;
    lay->ep_shard = d->ep_size > 1 ? cfg->derived.ep_shard : 1;
}

void mt_layout_coords(const mt_layout_t *lay, int64_t rank, int64_t coord[MT_NAXES])
{
    for (int a = MT_NAXES - 1; a >= 0; a--) {
        coord[a] = rank % lay->size[a];
        rank /= lay->size[a];
    }
}

int64_t mt_layout_rank(const mt_layout_t *lay, const int64_t coord[MT_NAXES])
{
    int64_t r = 0;
    for (int a = 0; a < MT_NAXES; a++)
        r = r * lay->size[a] + coord[a];
    return r;
}

int mt_layout_has_group(const mt_layout_t *lay, mt_group_t g)
{
    if (g == MT_GROUP_EP || g == MT_GROUP_EP_SHARD)
        return lay->ep > 1;
    return g < MT_NGROUPS;
}

int64_t mt_layout_group_size(const mt_layout_t *lay, mt_group_t g)
{
    if (g == MT_GROUP_EP)
        return lay->ep;
    if (g == MT_GROUP_EP_SHARD)
        return lay->ep_shard;
    int64_t n = 1;
    for (int a = 0; a < MT_NAXES; a++)
        if (group_axes[g] & (1u << a))
            n *= lay->size[a];
    return n;
}

int64_t mt_layout_num_groups(const mt_layout_t *lay, mt_group_t g)
{
    return lay->world / mt_layout_group_size(lay, g);
}

void mt_layout_group_of(const mt_layout_t *lay, mt_group_t g, int64_t rank, int64_t *group_id,
                        int64_t *index)
{
    int64_t c[MT_NAXES], id = 0, idx = 0;
    mt_layout_coords(lay, rank, c);
    if (g == MT_GROUP_EP || g == MT_GROUP_EP_SHARD) {
        /* Flat position among this (pp, tp) slice's dp x cp ranks. */
        int64_t f = (c[MT_AXIS_DP_REPLICATE] * lay->size[MT_AXIS_DP_SHARD] + c[MT_AXIS_DP_SHARD]) *
                        lay->size[MT_AXIS_CP] + c[MT_AXIS_CP];
        int64_t es = f / lay->ep, e = f % lay->ep;
        int64_t tp = lay->size[MT_AXIS_TP];
        if (g == MT_GROUP_EP)
            id = (c[MT_AXIS_PP] * lay->ep_shard + es) * tp + c[MT_AXIS_TP], idx = e;
        else
            id = (c[MT_AXIS_PP] * lay->ep + e) * tp + c[MT_AXIS_TP], idx = es;
    } else {
        for (int a = 0; a < MT_NAXES; a++) {
            if (group_axes[g] & (1u << a))
                idx = idx * lay->size[a] + c[a];
            else
                id = id * lay->size[a] + c[a];
        }
    }
    *group_id = id;
    *index = idx;
}

void mt_layout_group_table(const mt_layout_t *lay, mt_group_t g, int64_t *table)
{
    int64_t gs = mt_layout_group_size(lay, g);
    for (int64_t r = 0; r < lay->world; r++) {
        int64_t id, idx;
        mt_layout_group_of(lay, g, r, &id, &idx);
        table[id * gs + idx] = r;
    }
}

void mt_layout_write_groups(const mt_layout_t *lay, FILE *out, int64_t max_groups)
{
    for (int g = 0; g < MT_NGROUPS; g++) {
        if (!mt_layout_has_group(lay, (mt_group_t)g))
            continue;
        int64_t gs = mt_layout_group_size(lay, (mt_group_t)g);
        int64_t ng = mt_layout_num_groups(lay, (mt_group_t)g);
        int64_t *t = malloc(sizeof *t * (size_t)lay->world);
        if (!t) {
            fprintf(out, "  %-13s (out of memory listing groups)\n", mt_group_name((mt_group_t)g));
            continue;
        }
        mt_layout_group_table(lay, (mt_group_t)g, t);
        fprintf(out, "  %-13s %lld group%s of %lld:", mt_group_name((mt_group_t)g), (long long)ng,
                ng == 1 ? "" : "s", (long long)gs);
        int64_t show = (max_groups > 0 && ng > max_groups) ? max_groups : ng;
        for (int64_t i = 0; i < show; i++) {
            fputs(" [", out);
            for (int64_t j = 0; j < gs; j++)
                fprintf(out, "%s%lld", j ? "," : "", (long long)t[i * gs + j]);
            fputc(']', out);
        }
        if (show < ng)
            fprintf(out, " ... (%lld more; --all-groups lists them)", (long long)(ng - show));
        fputc('\n', out);
        free(t);
    }
}
