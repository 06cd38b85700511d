/* mt_mesh.h: the device mesh.
 *
 * The dense mesh is 5-D, (pp, dp_replicate, dp_shard, cp, tp), row-major
 * with tp innermost: the rank layout of a torch DeviceMesh of that shape.
 * With ep_size > 1 a second view, the MoE mesh (pp, ep_shard, ep), splits
 * each (pp, tp) slice's dp x cp ranks into ep_shard x ep.
 *
 * mt_layout_* is pure arithmetic with no MPI (meshtrain-plan uses it for a
 * 1024-rank world on a laptop).  mt_mesh_* builds one communicator per axis
 * and per flattened group from a given communicator, never from
 * MPI_COMM_WORLD. */
#ifndef MT_MESH_H
#define MT_MESH_H

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>

#include "mt_config.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    MT_AXIS_PP,
    MT_AXIS_DP_REPLICATE,
    MT_AXIS_DP_SHARD,
    MT_AXIS_CP,
    MT_AXIS_TP,
    MT_NAXES
} mt_axis_t;

/* Process groups: the five axes, the flattened data-parallel groups, and
 * the two axes of the MoE mesh. */
typedef enum {
    MT_GROUP_PP,
    MT_GROUP_DP_REPLICATE,
    MT_GROUP_DP_SHARD,
    MT_GROUP_CP,
    MT_GROUP_TP,
    MT_GROUP_DP,          /* dp_replicate x dp_shard */
    MT_GROUP_DP_SHARD_CP, /* dp_shard x cp: FSDP shards over this with CP */
    MT_GROUP_DP_CP,       /* dp_replicate x dp_shard x cp: gradient reduction */
    MT_GROUP_EP_SHARD,    /* MoE mesh */
    MT_GROUP_EP,          /* MoE mesh */
    MT_NGROUPS
} mt_group_t;

typedef struct {
    int64_t world;
    int64_t size[MT_NAXES]; /* pp, dp_replicate, dp_shard, cp, tp */
    int64_t ep, ep_shard;   /* ep == 1: no MoE mesh */
} mt_layout_t;

const char *mt_axis_name(mt_axis_t a);
const char *mt_group_name(mt_group_t g);

/* Sizes from a validated config. */
void mt_layout_from_config(const mt_config_t *cfg, mt_layout_t *lay);

/* Mesh coordinates of a rank, and the reverse. */
void mt_layout_coords(const mt_layout_t *lay, int64_t rank, int64_t coord[MT_NAXES]);
int64_t mt_layout_rank(const mt_layout_t *lay, const int64_t coord[MT_NAXES]);

/* Whether the group exists in this layout (the EP groups need ep > 1). */
int mt_layout_has_group(const mt_layout_t *lay, mt_group_t g);
int64_t mt_layout_group_size(const mt_layout_t *lay, mt_group_t g);
int64_t mt_layout_num_groups(const mt_layout_t *lay, mt_group_t g);

/* Which group a rank is in (0..num_groups-1) and its index inside it. */
void mt_layout_group_of(const mt_layout_t *lay, mt_group_t g, int64_t rank, int64_t *group_id,
                        int64_t *index);

/* table[group_id * group_size + index] = rank, for every group at once. */
void mt_layout_group_table(const mt_layout_t *lay, mt_group_t g, int64_t *table);

/* Print every group of every axis; at most max_groups groups per axis
 * (<= 0: all). */
void mt_layout_write_groups(const mt_layout_t *lay, FILE *out, int64_t max_groups);

typedef struct {
    MPI_Comm comm;               /* duplicate of the communicator given */
    int rank, size;
    mt_layout_t layout;
    int64_t coord[MT_NAXES];
    MPI_Comm group[MT_NGROUPS];  /* MPI_COMM_NULL where the group does not exist */
    int group_rank[MT_NGROUPS], group_size[MT_NGROUPS];
    MPI_Comm node;               /* ranks sharing memory with this one */
    int node_rank, node_size, node_id, num_nodes;
} mt_mesh_t;

/* Node of every rank of comm (node_of_rank has comm's size entries; ids
 * are dense, 0..num_nodes-1, in order of each node's lowest rank).
 * Collective over comm. */
mt_status_t mt_node_map(MPI_Comm comm, int *node_of_rank, int *num_nodes);

/* Build the mesh over comm for a validated config.  Collective over comm;
 * comm's size must equal the config's world size. */
mt_status_t mt_mesh_init(mt_mesh_t *mesh, MPI_Comm comm, const mt_config_t *cfg);
void mt_mesh_free(mt_mesh_t *mesh);

#ifdef __cplusplus
}
#endif
#endif
