/* meshtrain-ckpt: thin main; all logic lives in libmeshtrain (src/checkpoint/ckpt_cli.c,
 * src/hf/hf_cli.c).  list, verify, config and steps need no MPI launch and never
 * call MPI_Init; export and import start MPI and also run under mpiexec. */
#include "mt_ckpt_cli.h"

int main(int argc, char **argv)
{
    return mt_ckpt_tool_main(argc, argv);
}
