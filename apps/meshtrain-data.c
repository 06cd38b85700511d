/* meshtrain-data: thin main; all logic lives in libmeshtrain
 * (src/app/data_cli.c, src/data/data_par.c).  Runs as one process or under
 * mpiexec; --inspect and --help need no MPI. */
#include "mt_data_cli.h"

int main(int argc, char **argv)
{
    return mt_data_tool_main(argc, argv);
}
