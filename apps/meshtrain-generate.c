/* meshtrain-generate: thin main; all logic lives in libmeshtrain
 * (src/app/generate_cli.c). */
#include "mt_app.h"

int main(int argc, char **argv)
{
    return mt_generate_tool_main(argc, argv);
}
