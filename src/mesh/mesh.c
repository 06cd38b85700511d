/* mesh.c: MPI communicators for the device mesh (layout: mesh_layout.c).
 * Every function here is collective over the communicator it is given. */
#include "mt_mesh.h"

#include <stdlib.h>
#include <string.h>

mt_status_t mt_node_map(MPI_Comm comm, int *node_of_rank, int *num_nodes)
{
    int rank, size, leader;
    MPI_Comm node;
    MT_MPI_TRY(MPI_Comm_rank(comm, &rank));
    MT_MPI_TRY(MPI_Comm_size(comm, &size));
    MT_MPI_TRY(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
    /* The node's lowest rank names it: node rank 0, since key = rank. */
    leader = rank;
    MT_MPI_TRY(MPI_Bcast(&leader, 1, MPI_INT, 0, node));
    MPI_Comm_free(&node);
    MT_MPI_TRY(MPI_Allgather(&leader, 1, MPI_INT, node_of_rank, 1, MPI_INT, comm));

    int *id_of = malloc(sizeof *id_of * (size_t)size);
    if (!id_of)
        MT_FAIL(MT_ERR_NOMEM, "node map for %d ranks", size);
    int n = 0;
    for (int r = 0; r < size; r++)
        if (node_of_rank[r] == r)
            id_of[r] = n++;
    for (int r = 0; r < size; r++)
        node_of_rank[r] = id_of[node_of_rank[r]];
    free(id_of);
    if (num_nodes)
        *num_nodes = n;
    return MT_OK;
}

mt_status_t mt_mesh_init(mt_mesh_t *mesh, MPI_Comm comm, const mt_config_t *cfg)
{
    memset(mesh, 0, sizeof *mesh);
    for (int g = 0; g < MT_NGROUPS; g++)
        mesh->group[g] = MPI_COMM_NULL;
    mesh->comm = mesh->node = MPI_COMM_NULL;
    if (!cfg->validated)
        MT_FAIL(MT_ERR_RANGE, "mt_mesh_init needs a validated config");

    MT_MPI_TRY(MPI_Comm_dup(comm, &mesh->comm));
    MT_MPI_TRY(MPI_Comm_rank(mesh->comm, &mesh->rank));
    MT_MPI_TRY(MPI_Comm_size(mesh->comm, &mesh->size));
    mt_layout_from_config(cfg, &mesh->layout);
    if (mesh->layout.world != mesh->size)
        MT_FAIL(MT_ERR_RANGE, "config validated for %lld ranks, communicator has %d",
                (long long)mesh->layout.world, mesh->size);
    mt_layout_coords(&mesh->layout, mesh->rank, mesh->coord);

    for (int g = 0; g < MT_NGROUPS; g++) {
        if (!mt_layout_has_group(&mesh->layout, (mt_group_t)g))
            continue;
        int64_t id, idx;
        mt_layout_group_of(&mesh->layout, (mt_group_t)g, mesh->rank, &id, &idx);
        MT_MPI_TRY(MPI_Comm_split(mesh->comm, (int)id, (int)idx, &mesh->group[g]));
        MT_MPI_TRY(MPI_Comm_rank(mesh->group[g], &mesh->group_rank[g]));
        MT_MPI_TRY(MPI_Comm_size(mesh->group[g], &mesh->group_size[g]));
        if (mesh->group_size[g] != mt_layout_group_size(&mesh->layout, (mt_group_t)g) ||
            mesh->group_rank[g] != idx)
            MT_FAIL(MT_ERR_INTERNAL, "%s group: size %d rank %d, layout says %lld and %lld",
                    mt_group_name((mt_group_t)g), mesh->group_size[g], mesh->group_rank[g],
                    (long long)mt_layout_group_size(&mesh->layout, (mt_group_t)g), (long long)idx);
    }

    MT_MPI_TRY(MPI_Comm_split_type(mesh->comm, MPI_COMM_TYPE_SHARED, mesh->rank, MPI_INFO_NULL,
                                   &mesh->node));
    MT_MPI_TRY(MPI_Comm_rank(mesh->node, &mesh->node_rank));
    MT_MPI_TRY(MPI_Comm_size(mesh->node, &mesh->node_size));
    int *map = malloc(sizeof *map * (size_t)mesh->size);
    if (!map)
        MT_FAIL(MT_ERR_NOMEM, "node map for %d ranks", mesh->size);
    mt_status_t s = mt_node_map(mesh->comm, map, &mesh->num_nodes);
    mesh->node_id = map[mesh->rank];
    free(map);
    MT_TRY(s);
    return MT_OK;
}

void mt_mesh_free(mt_mesh_t *mesh)
{
    for (int g = 0; g < MT_NGROUPS; g++)
        if (mesh->group[g] != MPI_COMM_NULL)
            MPI_Comm_free(&mesh->group[g]);
    if (mesh->node != MPI_COMM_NULL)
        MPI_Comm_free(&mesh->node);
    if (mesh->comm != MPI_COMM_NULL)
        MPI_Comm_free(&mesh->comm);
}
