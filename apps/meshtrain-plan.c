/* meshtrain-plan: thin main; all logic lives in libmeshtrain (src/app/plan_cli.c).
 * Needs no MPI launch: it never calls MPI_Init. */
#include <stdio.h>

#include "mt_app.h"

int main(int argc, char **argv)
{
    return mt_plan_main(argc, argv, stdout, stderr);
}
